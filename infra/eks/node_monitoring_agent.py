"""NodeMonitoringAgent: the EKS node monitoring agent add-on, which turns node faults into Node
conditions that Karpenter's NodeRepair acts on (karpenter.py; README, "Node health and repair").

Its DaemonSet runs on every node (it tolerates every taint) and sets KernelReady,
NetworkingReady, StorageReady, ContainerRuntimeReady and, on GPU nodes, AcceleratedHardwareReady
(aws/eks-node-monitoring-agent v1.7.0). Its GPU checks (XID errors as DCGM policy violations,
DCGM health checks and field watches, the GPU count: monitors/nvidia) are DCGM client calls to a
host engine the add-on runs on GPU nodes, the dcgm-server DaemonSet (nv-hostengine on host port
5555, charts/eks-node-monitoring-agent/templates/dcgm-daemonset.yaml). That DaemonSet tolerates
no taint by default, and every GPU pool's nodes carry the GPU taint: without the toleration below
the agent would check no GPU of ours. Its default affinity keeps it to the GPU instance types
the add-on lists and off hybrid nodes.

One host engine per node: DCGM's maintainers call several on one machine unsupported (they do
not share the profiling module and can deadlock in the driver), so the DCGM exporter on pool GPU
nodes reads through this one (infra/gpu/metrics.py) instead of embedding its own.
"""

import json

import pulumi
import pulumi_aws as aws

from infra.core.context import ClusterContext
from infra.core.nodes import GPU_TOLERATION

ADDON = "eks-node-monitoring-agent"
DCGM_HOST_ENGINE_PORT = 5555
# Checked against the add-on's configuration schema at the pinned version (tests).
CONFIGURATION = {"dcgmAgent": {"tolerations": [GPU_TOLERATION]}}


class NodeMonitoringAgent(pulumi.ComponentResource):
    addon: aws.eks.Addon

    def __init__(
        self,
        name: str,
        cluster: ClusterContext,
        addon_version: str,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:NodeMonitoringAgent", name, None, opts)
        self.addon = aws.eks.Addon(
            name,
            cluster_name=cluster.name,
            addon_name=ADDON,
            addon_version=addon_version,
            resolve_conflicts_on_update="OVERWRITE",
            configuration_values=json.dumps(CONFIGURATION),
            tags=cluster.tags,
            # EKS reports the add-on active once its pods run: on the system nodes, pulled
            # through the VPC's egress.
            opts=pulumi.ResourceOptions(parent=self, depends_on=cluster.controller_prerequisites),
        )
        self.register_outputs({"addon": self.addon.addon_name})
