"""Storage (infra/storage): FSx for Lustre, EFS, the training bucket and the EBS CSI driver and
classes, each store's protection and backups; its stack-config section `storage`.
"""

from infra.core.facts import Integration
from infra.storage import day_two, facts

# The packages of infra this one may import, besides itself (tests/e2e/test_layers.py).
INPUTS = ("core", "vpc")
STORAGE = Integration(
    "storage",
    kinds=facts.KINDS,
    addons=facts.ADDONS,
    holders=facts.HOLDERS,
    day_two=(day_two.mounted_lost, day_two.expiring, day_two.rebound_claims),
)
