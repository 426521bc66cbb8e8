"""EKS (infra/eks): the control plane, the system node group the platform's controllers run on,
the add-ons EKS installs and the node monitoring agent; Kubernetes version support; its
stack-config section `cluster`.
"""

from infra.core.facts import Integration
from infra.eks import day_two, facts

# The packages of infra this one may import, besides itself (tests/e2e/test_layers.py).
INPUTS = ("core", "vpc")
EKS = Integration(
    "eks",
    kinds=facts.KINDS,
    addons=facts.ADDONS,
    pods=facts.pods,
    system_nodes=facts.system_nodes,
    holders=facts.HOLDERS,
    day_two=(
        day_two.versions,
        day_two.controllers,
        day_two.control_plane_subnets,
        day_two.control_plane_network,
        day_two.log_retention,
    ),
)
