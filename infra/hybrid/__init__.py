"""Hybrid nodes (infra/hybrid): machines outside AWS joined as EKS hybrid nodes through a WireGuard
gateway, their credentials, admission, homes and placement; its stack-config section `hybrid`.
"""

from infra.core.facts import Integration
from infra.hybrid import facts

# The packages of infra this one may import, besides itself (tests/e2e/test_layers.py).
INPUTS = ("core", "eks", "kueue")
HYBRID = Integration("hybrid", kinds=facts.KINDS, charts=facts.CHARTS, overlays=facts.OVERLAYS)
