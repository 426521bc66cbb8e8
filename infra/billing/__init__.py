"""Billing (infra/billing): the stack's tags activated as cost allocation tags, so the bill
itself can be split by stack, cluster, pool and namespace (docs/platform/capacity-and-cost.md)."""

from infra.billing import day_two, facts
from infra.core.facts import Integration

# The packages of infra this one may import, besides itself (tests/e2e/test_layers.py).
INPUTS = ("core", "images")
BILLING = Integration(
    "billing",
    kinds=facts.KINDS,
    holders=facts.HOLDERS,
    day_two=(day_two.activation, day_two.recorder_rights),
)
