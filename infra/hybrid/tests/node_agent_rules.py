"""Every DaemonSet the platform installs, as its chart or add-on makes it at the pinned versions:
where it may run (tolerations and required node affinity; the configuration key, if any, that
replaces the affinity) and what its ServiceAccount may write on Nodes (`nodes`, `nodes/status`),
with the configuration key, if any, that drops those rights. A machine owner holds the tokens of
the pods on her machine, so an agent that may write Nodes must never run there
(infra/hybrid/tests/test_hybrid_tenancy.py checks it on the plan).

Read from upstream on 2026-11-29 (each entry names its file):
- kubernetes-sigs/aws-ebs-csi-driver chart 2.57.1/2.63.1 (drivers v1.57.1, v1.63.1; 2.51.2 for
  v1.51.1), kubernetes-sigs/aws-efs-csi-driver chart 3.2.4 (v2.1.13), kubernetes-sigs/
  aws-fsx-csi-driver chart 1.14.0 at 20b004e4 (v1.7.0): charts/<driver>/values.yaml `node:` and
  the node ClusterRole template;
- aws/eks-node-monitoring-agent v1.7.0 charts/eks-node-monitoring-agent (templates/
  clusterrole.yaml, daemonset.yaml, dcgm-daemonset.yaml);
- aws/amazon-vpc-cni-k8s v1.20.4/v1.21.1/v1.22.4 charts/aws-vpc-cni (values.yaml affinity,
  templates/clusterrole.yaml);
- kube-proxy: EKS builds it (no public manifest); it runs on hybrid nodes (EKS user guide,
  hybrid-nodes-proxy) as ServiceAccount kube-proxy bound to `system:node-proxier`, whose rules
  are Kubernetes' bootstrap policy (plugin/pkg/auth/authorizer/rbac/bootstrappolicy/testdata/
  cluster-roles.yaml: nodes get, list, watch);
- aws/eks-pod-identity-agent charts/eks-pod-identity-agent at d4dc0f3 (templates/daemonset.yaml:
  automountServiceAccountToken false, no ServiceAccount);
- the Helm charts: NVIDIA/k8s-device-plugin v0.18.0 deployments/helm/nvidia-device-plugin (no
  ServiceAccount or role without a config map or GFD, which the platform does not set), NVIDIA/
  dcgm-exporter deployment at 4.8.2 (no token at the defaults; its pod-reading ClusterRole only
  with pod labels or DRA; no node rules), aws/eks-charts v0.5.30 stable/aws-efa-k8s-device-plugin
  (automountServiceAccountToken false), prometheus-community prometheus-node-exporter 4.56.1 (of
  kube-prometheus-stack 88.5.3: no token, no role without kubeRBACProxy), cilium 1.18.5-0 as
  aws/eks-hybrid renders it (test/e2e/cni/testdata/cilium: nodes get, list, watch; nodes/status
  only with annotateK8sNode, which the platform does not set). Karpenter, Kueue and the CRD charts
  install no DaemonSet; CoreDNS is a Deployment.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from infra.core.declared import dig
from infra.core.nodes import COMPUTE_TYPE
from infra.hybrid.machines import HYBRID_NODE_AFFINITY

ALL_TAINTS = ({"operator": "Exists"},)
NODE_WRITES = ("create", "update", "patch", "delete", "deletecollection")


def not_on(*compute_types: str) -> dict:
    """Required node affinity: nodes whose EKS compute type is none of `compute_types`."""
    expression = {"key": COMPUTE_TYPE, "operator": "NotIn", "values": list(compute_types)}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expression]}]
            }
        }
    }


@dataclass(frozen=True)
class NodeAgent:
    daemonset: str
    source: str
    tolerations: tuple[dict, ...]
    affinity: dict | None  # required node affinity by default
    node_verbs: Mapping[str, tuple[str, ...]]  # resource (nodes, nodes/status) -> verbs
    affinity_key: tuple[str, ...] | None = None  # configuration that replaces `affinity`
    # A configuration key that, true, leaves `kept` of its node rights.
    no_mutation_key: tuple[str, ...] | None = None
    kept: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    created_by: tuple[str, ...] | None = None  # configuration key without which it is not made

    def pod(self, configuration: Mapping) -> dict:
        """Its pod's placement under the add-on's configuration."""
        affinity = dig(configuration, *self.affinity_key) if self.affinity_key else None
        return {"tolerations": list(self.tolerations), "affinity": affinity or self.affinity}

    def writes_nodes(self, configuration: Mapping) -> list[str]:
        """`resource: verb` of every Node write its ServiceAccount keeps."""
        verbs = self.node_verbs
        if self.no_mutation_key and dig(configuration, *self.no_mutation_key) is True:
            verbs = self.kept
        return [f"{r}: {v}" for r, vs in verbs.items() for v in vs if v in NODE_WRITES]

    def made(self, configuration: Mapping) -> bool:
        return self.created_by is None or dig(configuration, *self.created_by) is True


CSI_NODE_VERBS = {"nodes": ("get", "patch", "list", "watch")}
# By EKS add-on name: the DaemonSets each makes.
ADDON_AGENTS: dict[str, tuple[NodeAgent, ...]] = {
    "aws-ebs-csi-driver": (
        NodeAgent(
            "ebs-csi-node",
            "aws-ebs-csi-driver chart 2.57.1 values.yaml node.affinity, node.tolerateAllTaints; "
            "templates/clusterrole-csi-node.yaml (disableMutation from chart 2.52.0)",
            ALL_TAINTS,
            not_on("fargate", "auto", "hybrid"),
            CSI_NODE_VERBS,
            affinity_key=("node", "affinity"),
            no_mutation_key=("node", "serviceAccount", "disableMutation"),
            kept={"nodes": ("get",)},
        ),
    ),
    "aws-efs-csi-driver": (
        NodeAgent(
            "efs-csi-node",
            "aws-efs-csi-driver chart 3.2.4 values.yaml node.affinity, node.tolerations; "
            "templates/node-serviceaccount.yaml (no switch before chart 3.2.6)",
            ALL_TAINTS,
            not_on("fargate", "hybrid"),
            CSI_NODE_VERBS,
            affinity_key=("node", "affinity"),
        ),
    ),
    "aws-fsx-csi-driver": (
        NodeAgent(
            "fsx-csi-node",
            "aws-fsx-csi-driver chart 1.14.0 (20b004e4) values.yaml node.affinity, "
            "node.tolerateAllTaints; templates/clusterrole-csi-node.yaml (no switch)",
            ALL_TAINTS,
            not_on("fargate"),
            {"nodes": ("get", "patch")},
            affinity_key=("node", "affinity"),
        ),
    ),
    "eks-node-monitoring-agent": (
        NodeAgent(
            "eks-node-monitoring-agent",
            "eks-node-monitoring-agent v1.7.0 values.yaml nodeAgent.affinity, "
            "templates/clusterrole.yaml",
            ALL_TAINTS,
            not_on("fargate", "auto", "hybrid"),
            {"nodes": ("get", "watch", "list"), "nodes/status": ("patch",)},
            affinity_key=("nodeAgent", "affinity"),
        ),
        NodeAgent(
            "dcgm-server",
            "eks-node-monitoring-agent v1.7.0 templates/dcgm-daemonset.yaml (no ServiceAccount)",
            (),
            not_on("fargate", "auto", "hybrid"),
            {},
            affinity_key=("dcgmAgent", "affinity"),
        ),
    ),
    "vpc-cni": (
        NodeAgent(
            "aws-node",
            "amazon-vpc-cni-k8s charts/aws-vpc-cni values.yaml, templates/clusterrole.yaml",
            ALL_TAINTS,
            not_on("fargate", "hybrid", "auto"),
            {"nodes": ("list", "watch", "get")},
        ),
    ),
    "kube-proxy": (
        NodeAgent(
            "kube-proxy",
            "EKS's kube-proxy on hybrid nodes (user guide); system:node-proxier",
            ALL_TAINTS,
            None,
            {"nodes": ("get", "list", "watch")},
        ),
    ),
    "eks-pod-identity-agent": (
        NodeAgent(
            "eks-pod-identity-agent",
            "eks-pod-identity-agent chart templates/daemonset.yaml (no token)",
            ALL_TAINTS,
            not_on("fargate", "hybrid", "auto"),
            {},
        ),
        NodeAgent(
            "eks-pod-identity-agent-hybrid",
            "eks-pod-identity-agent chart values.yaml daemonsets.hybrid (no token)",
            ALL_TAINTS,
            HYBRID_NODE_AFFINITY,
            {},
            created_by=("daemonsets", "hybrid", "create"),
        ),
    ),
    "coredns": (),  # a Deployment
}
# The Helm releases the platform installs (helm_release names): none makes a DaemonSet whose
# ServiceAccount may write Nodes, wherever the release's values put it.
RELEASES_WITHOUT_NODE_WRITES = frozenset(
    {
        "nvidia-device-plugin",
        "aws-efa-k8s-device-plugin",
        "dcgm-exporter",
        "dcgm-exporter-hybrid",
        "kube-prometheus-stack",  # prometheus-node-exporter
        "cilium",
        "karpenter",  # no DaemonSet
        "karpenter-crd",
        "kueue",
    }
)
