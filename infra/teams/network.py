"""TenantNetwork: no pod of a tenant namespace (a team's, a DevServer user's) accepts connections
that a NetworkPolicy of its own namespace does not allow; the VPC CNI enforces them (cluster.py,
enableNetworkPolicy).

What is allowed is each workload's own: in a team's namespace, the team's pods to each other (the
jobs its members submit themselves, PyTorchJobs and TrainJobs alike, rendezvous among their own
pods: one team is one tenant), a stack job's pods to each other (workloads/manifests.py
network_policy); in a user's namespace, a DevServer's pods to each other and its SSH load
balancer to its sshd (devservers/render.py network_policy, the operator's). The rest needs none:
DNS and whatever a pod calls are its egress, which stays open; kubectl and devctl reach pods
through the API server and the node's kubelet (exec, logs, port-forward), which no policy can
block.
"""

import pulumi
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext
from infra.core.network_policies import DEFAULT_DENY, default_deny_ingress, same_namespace

SAME_TEAM = "team-pods"


class TenantNetwork(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cluster: ClusterContext,
        teams: dict[str, k8s.core.v1.Namespace],
        users: dict[str, k8s.core.v1.Namespace],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:TenantNetwork", name, None, opts)
        for key, namespace in {**teams, **users}.items():
            k8s.networking.v1.NetworkPolicy(
                f"{name}-{key}",
                metadata={"name": DEFAULT_DENY, "namespace": namespace.metadata.name},
                spec=default_deny_ingress(),
                opts=cluster.in_cluster(self, namespace),
            )
        for key, namespace in teams.items():
            k8s.networking.v1.NetworkPolicy(
                f"{name}-{key}-team",
                metadata={"name": SAME_TEAM, "namespace": namespace.metadata.name},
                spec=same_namespace(),
                opts=cluster.in_cluster(self, namespace),
            )
        self.register_outputs({})
