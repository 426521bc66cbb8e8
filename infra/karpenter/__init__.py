"""Karpenter (infra/karpenter): the controller, its EC2NodeClasses and NodePools (one per pool:
limits, reservations, placement groups), each pool's cold start and fabric check; its
stack-config sections `karpenter` and `nodePools`.
"""

from infra.core.facts import Integration
from infra.karpenter import day_two, facts

# The packages of infra this one may import, besides itself (tests/e2e/test_layers.py).
INPUTS = ("core", "eks", "vpc")
KARPENTER = Integration(
    "karpenter",
    kinds=facts.KINDS,
    charts=facts.CHARTS,
    stack_lines=facts.stray_pool_lines,
    day_two=(day_two.drift,),
)
