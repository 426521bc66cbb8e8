"""Kueue (infra/kueue): the controller, its ResourceFlavors, ClusterQueues and LocalQueues, the
teams' shares and borrowing, and which changes restart a running job; its stack-config section
`queues`.
"""

from infra.core.facts import Integration
from infra.kueue import facts

# The packages of infra this one may import, besides itself (tests/e2e/test_layers.py).
INPUTS = ("core", "jobs", "karpenter")
KUEUE = Integration("kueue", kinds=facts.KINDS, charts=facts.CHARTS, holders=facts.HOLDERS)
