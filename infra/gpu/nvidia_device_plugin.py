"""NVIDIA device plugin: advertises `nvidia.com/gpu` on GPU nodes, without which no pod gets a GPU.

AL2023 NVIDIA AMIs ship the driver but not the plugin (Bottlerocket would; never run both).
"""

import pulumi

from infra.core.context import ClusterContext
from infra.core.helm import helm_release
from infra.core.nodes import GPU_NODE_LABELS
from infra.core.versions import NVIDIA_DEVICE_PLUGIN_CHART
from infra.hybrid.machines import GPU_AGENT_TOLERATIONS


class NvidiaDevicePlugin(pulumi.ComponentResource):
    def __init__(
        self, name: str, cluster: ClusterContext, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("training-platform:infra:NvidiaDevicePlugin", name, None, opts)
        self.release = helm_release(
            "nvidia-device-plugin",
            NVIDIA_DEVICE_PLUGIN_CHART,
            "nvidia-device-plugin",
            {
                # Only GPU nodes: the pools label them, and their taint is tolerated.
                "nodeSelector": GPU_NODE_LABELS,
                "tolerations": GPU_AGENT_TOLERATIONS,
                "priorityClassName": "system-node-critical",
                "gfd": {"enabled": False},
                "nfd": {"enabled": False},
            },
            cluster.in_cluster(self),
        )
        self.register_outputs({})
