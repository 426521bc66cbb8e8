"""The VPC (infra/vpc): subnets across the zones, NAT gateways, endpoints and the security groups
the cluster and the file systems sit in; its stack-config section `network`.
"""

from infra.core.facts import Integration
from infra.vpc import day_two, facts

# The packages of infra this one may import, besides itself (tests/e2e/test_layers.py).
INPUTS = ("core",)
VPC = Integration("vpc", kinds=facts.KINDS, day_two=(day_two.network,))
