"""AWS EFA device plugin: advertises `vpc.amazonaws.com/efa` on EFA nodes.

Neither AL2023 nor Bottlerocket AMIs ship it; without it a pod asking for EFA interfaces never
schedules. It runs only on nodes of EFA pools (their NodePools label them).
"""

import pulumi

from infra.core.context import ClusterContext
from infra.core.helm import helm_release
from infra.core.nodes import EFA_NODE_LABELS, GPU_TOLERATION
from infra.core.versions import EFA_DEVICE_PLUGIN_CHART


class EfaDevicePlugin(pulumi.ComponentResource):
    def __init__(
        self, name: str, cluster: ClusterContext, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("training-platform:infra:EfaDevicePlugin", name, None, opts)
        self.release = helm_release(
            "aws-efa-k8s-device-plugin",
            EFA_DEVICE_PLUGIN_CHART,
            "kube-system",
            {
                "nodeSelector": EFA_NODE_LABELS,
                "tolerations": [GPU_TOLERATION],
            },
            cluster.in_cluster(self),
        )
        self.register_outputs({})
