"""NetworkPolicy specs every integration builds its namespaces' ingress from (networking.k8s.io/v1;
the VPC CNI enforces them: infra/eks/cluster.py enableNetworkPolicy), and the policies of a
namespace the platform owns: default-deny, plus the API server's calls where a controller serves
webhooks or an aggregated API.

What no policy needs to admit: the kubelet's probes and whatever else comes from a pod's own node
(the VPC CNI's network policy agent adds the node's address to every isolated pod's allowed
sources: aws/aws-network-policy-agent pkg/fwruleprocessor/fw_rule_processor.go, "Traffic from the
local node should always be allowed", at the agents of every pinned vpc-cni build, v1.2.7 to
v1.4.0); kubectl's exec, logs and port-forward (the kubelet enters the pod's own network).
"""

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext

DEFAULT_DENY = "default-deny-ingress"
FROM_THE_API_SERVER = "from-the-api-server"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # the API server sets it on every namespace


def default_deny_ingress(pods: dict | None = None) -> dict:
    """Selects `pods` (every pod of its namespace by default) and admits nothing: each is
    isolated for ingress, so only what another policy of the namespace admits reaches it
    (NetworkPolicySpec: "If this field is empty then this NetworkPolicy does not allow any
    traffic")."""
    return {"podSelector": pods or {}, "policyTypes": ["Ingress"]}


def same_namespace() -> dict:
    """Every pod of its namespace admits every pod of the same namespace, on any port, and no
    one else."""
    return {
        "podSelector": {},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {}}]}],
    }


def admit_pods(selected: dict, namespace: str, labels: dict, port: int) -> dict:
    """The pods labelled `selected` admit, on TCP `port`, the pods labelled `labels` in
    `namespace` (by the label the API server gives every namespace, its name)."""
    return {
        "podSelector": {"matchLabels": selected},
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [
                    {
                        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}},
                        "podSelector": {"matchLabels": labels},
                    }
                ],
                "ports": [{"protocol": "TCP", "port": port}],
            }
        ],
    }


def from_control_plane(
    sources: Sequence[str], ports: Sequence[int], pods: dict | None = None
) -> dict:
    """`pods` (every pod of the namespace by default) admit, on TCP `ports` (the pods' own, not
    a Service's), the API server calling an admission webhook, a CRD conversion or an aggregated
    API. It calls from the network interfaces EKS places in the cluster's subnets ("EKS cluster
    IPs": EKS user guide, hybrid-nodes-networking; network-reqs, "Subnet requirements"), which
    the stack's VPC gives subnets of their own: `sources`, ClusterContext.vpc."""
    return {
        "podSelector": pods or {},
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [{"ipBlock": {"cidr": cidr}} for cidr in sources],
                "ports": [{"protocol": "TCP", "port": port} for port in ports],
            }
        ],
    }


def platform_namespace(
    name: str,
    namespace: str,
    cluster: ClusterContext,
    parent: pulumi.Resource,
    after: Sequence[pulumi.Resource],
    control_plane_ports: Sequence[int] = (),
) -> None:
    """A namespace the platform owns admits nothing but the API server on `control_plane_ports`
    (its controllers' webhooks and aggregated APIs): no tenant pod reaches a controller."""
    opts = cluster.in_cluster(parent, *after)
    k8s.networking.v1.NetworkPolicy(
        f"{name}-default-deny",
        metadata={"name": DEFAULT_DENY, "namespace": namespace},
        spec=default_deny_ingress(),
        opts=opts,
    )
    if control_plane_ports:
        k8s.networking.v1.NetworkPolicy(
            f"{name}-from-the-api-server",
            metadata={"name": FROM_THE_API_SERVER, "namespace": namespace},
            spec=from_control_plane(cluster.vpc.control_plane_sources, control_plane_ports),
            opts=opts,
        )
