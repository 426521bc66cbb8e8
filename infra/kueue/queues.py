"""Kueue queues derived from the NodePools: flavors, ClusterQueues with quotas, team LocalQueues.

Each pool's nominal quota is its Karpenter ceiling (NodePoolConfig.ceiling), so Kueue admits no
more than Karpenter may launch; Karpenter then scales on the admitted pods.
"""

import math
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext
from infra.core.data_holders import annotated
from infra.core.nodes import GPU_TAINT, POOL_LABEL
from infra.karpenter.config import NodePoolConfig
from infra.kueue.config import QueuesConfig, TeamConfig
from infra.kueue.facts import team_holder

API_VERSION = "kueue.x-k8s.io/v1beta2"
PLATFORM_QUEUE = "platform"
QUEUE_ACCESS_LABEL = "training-platform/queue-access"
# Every namespace of a team carries it: the team namespace and its members' DevServer namespaces.
TEAM_LABEL = "training-platform/team"
COVERED_RESOURCES = ["cpu", "memory", "nvidia.com/gpu"]
# The Kueue Topology of pools whose nodes exist (NodePoolConfig.topology): EC2's network layers,
# top down, as EKS's cloud controller labels nodes with them (kubernetes/cloud-provider-aws,
# pkg/providers/v1/instances_v2.go getAdditionalLabels: layer 1 is the top of the hierarchy),
# and the node itself lowest, as Kueue requires of kubernetes.io/hostname (its Topology CRD's
# rule) and needs to respect node taints.
NETWORK_TOPOLOGY = "aws-network"
TOPOLOGY_LEVELS = [
    "topology.k8s.aws/network-node-layer-1",
    "topology.k8s.aws/network-node-layer-2",
    "topology.k8s.aws/network-node-layer-3",
    "kubernetes.io/hostname",
]
# What job pods on those pools ask for: all under one bottom-layer network node if they fit,
# else the next layer up, else spread (kueue.x-k8s.io/podset-preferred-topology).
PREFERRED_TOPOLOGY_LEVEL = TOPOLOGY_LEVELS[2]
# Pod Security Admission: enforce baseline (no host access, no privileged pods) and warn/audit
# against restricted: the FSx folder's init container of the platform's own job pods needs
# CHOWN and DAC_OVERRIDE as root, which baseline admits and restricted does not.
POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "baseline",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
}


def resource_flavor_spec(pool: NodePoolConfig) -> dict:
    spec: dict = {"nodeLabels": {POOL_LABEL: pool.name}}
    if pool.gpu:
        # Admitted pods get the toleration injected, so job specs need not carry it.
        spec["nodeTaints"] = [GPU_TAINT]
        spec["tolerations"] = [{**GPU_TAINT, "operator": "Equal"}]
    if pool.topology:
        spec["topologyName"] = NETWORK_TOPOLOGY
    return spec


def topology_spec() -> dict:
    return {"levels": [{"nodeLabel": label} for label in TOPOLOGY_LEVELS]}


@dataclass(frozen=True)
class Flavor:
    """A flavor not backed by a NodePool (hybrid nodes): its spec and its fixed capacity."""

    name: str
    spec: dict
    amounts: dict[str, int]  # per COVERED_RESOURCES name; memory in GiB
    annotations: dict[str, str]


def quotas(pool: NodePoolConfig, share: float | None = None) -> list[dict]:
    """Nominal quota = the pool's ceiling; with `share`, a borrowing-only quota instead."""
    ceiling = pool.ceiling()
    amounts = {"cpu": ceiling.vcpu, "memory": ceiling.memory_gib, "nvidia.com/gpu": ceiling.gpus}
    return quota_entries(amounts, share)


def quota_entries(amounts: dict[str, int], share: float | None = None) -> list[dict]:
    resources = []
    for name in COVERED_RESOURCES:
        unit = "Gi" if name == "memory" else ""
        entry = {"name": name, "nominalQuota": f"0{unit}" if share else f"{amounts[name]}{unit}"}
        if share:
            entry["borrowingLimit"] = f"{math.ceil(amounts[name] * share)}{unit}"
        resources.append(entry)
    return resources


def cluster_queue_spec(
    pools: list[NodePoolConfig],
    queues: QueuesConfig,
    namespace_selector: dict,
    share: float | None = None,
    extra_flavors: tuple[Flavor, ...] = (),
) -> dict:
    # CPU flavors first: a job without GPU requests (and no pool selector) lands on CPU nodes.
    # Extra flavors last: only jobs that tolerate their taints are admitted there.
    ordered = sorted(pools, key=lambda p: p.gpu)
    flavors = [{"name": p.name, "resources": quotas(p, share)} for p in ordered]
    flavors += [
        {"name": f.name, "resources": quota_entries(f.amounts, share)} for f in extra_flavors
    ]
    return {
        "cohortName": queues.cohort,
        "namespaceSelector": namespace_selector,
        "queueingStrategy": "BestEffortFIFO",
        "preemption": {
            "reclaimWithinCohort": queues.reclaim_within_cohort,
            "withinClusterQueue": queues.within_cluster_queue,
        },
        "resourceGroups": [
            {
                "coveredResources": COVERED_RESOURCES,
                "flavors": flavors,
            }
        ],
    }


def team_cluster_queue(team: TeamConfig) -> str:
    return f"team-{team.name}" if team.own_cluster_queue else PLATFORM_QUEUE


class Queues(pulumi.ComponentResource):
    namespaces: dict[str, k8s.core.v1.Namespace]  # team name -> its namespace
    local_queues: dict[str, pulumi.Resource]  # team name -> its LocalQueue

    def __init__(
        self,
        name: str,
        pools: list[NodePoolConfig],
        queues: QueuesConfig,
        kueue_release: pulumi.Resource,
        # What the pods of a team namespace need until they are gone: Kueue (its finalizers)
        # and the CSI drivers of their volumes. Destroy deletes the namespaces first.
        namespace_prerequisites: list[pulumi.Resource],
        cluster: ClusterContext,
        opts: pulumi.ResourceOptions | None = None,
        extra_flavors: tuple[Flavor, ...] = (),
    ):
        super().__init__("training-platform:infra:Queues", name, None, opts)
        # The Kueue chart brings the CRDs: nothing here can be created before it.
        child = cluster.in_cluster(self, kueue_release)

        def custom(resource_name: str, kind: str, metadata: dict, spec: dict, depends=()):
            return k8s.apiextensions.CustomResource(
                resource_name,
                api_version=API_VERSION,
                kind=kind,
                metadata=metadata,
                spec=spec,
                opts=pulumi.ResourceOptions.merge(
                    child, pulumi.ResourceOptions(depends_on=list(depends))
                ),
            )

        # A flavor naming the Topology is created after it and deleted before it.
        topology = (
            [custom(f"{name}-topology", "Topology", {"name": NETWORK_TOPOLOGY}, topology_spec())]
            if any(p.topology for p in pools)
            else []
        )
        flavors = [
            custom(
                f"{name}-flavor-{p.name}",
                "ResourceFlavor",
                {"name": p.name},
                resource_flavor_spec(p),
                topology if p.topology else [],
            )
            for p in pools
        ] + [
            custom(
                f"{name}-flavor-{f.name}",
                "ResourceFlavor",
                {"name": f.name, "annotations": f.annotations},
                f.spec,
            )
            for f in extra_flavors
        ]
        cluster_queues = {
            PLATFORM_QUEUE: custom(
                f"{name}-{PLATFORM_QUEUE}",
                "ClusterQueue",
                {"name": PLATFORM_QUEUE},
                cluster_queue_spec(
                    pools,
                    queues,
                    {"matchLabels": {QUEUE_ACCESS_LABEL: "true"}},
                    extra_flavors=extra_flavors,
                ),
                flavors,
            )
        }
        for team in queues.teams:
            if team.own_cluster_queue:
                selector = {"matchLabels": {TEAM_LABEL: team.name}}
                share = team.borrowing_limit_percent / 100
                cluster_queues[team_cluster_queue(team)] = custom(
                    f"{name}-team-{team.name}",
                    "ClusterQueue",
                    {"name": team_cluster_queue(team)},
                    cluster_queue_spec(pools, queues, selector, share, extra_flavors),
                    flavors,
                )
        self.namespaces = {}
        self.local_queues = {}
        for team in queues.teams:
            # Deleting a namespace deletes everything in it, the running jobs included.
            holder = team_holder(team.name)
            namespace = self.namespaces[team.name] = k8s.core.v1.Namespace(
                f"{name}-ns-{team.name}",
                metadata=annotated(
                    {
                        "name": team.namespace_name,
                        "labels": {
                            QUEUE_ACCESS_LABEL: str(not team.own_cluster_queue).lower(),
                            TEAM_LABEL: team.name,
                            **POD_SECURITY_LABELS,
                        },
                    },
                    holder,
                ),
                opts=cluster.holding(holder, self, *namespace_prerequisites),
            )
            self.local_queues[team.name] = custom(
                f"{name}-lq-{team.name}",
                "LocalQueue",
                {"name": team.name, "namespace": team.namespace_name},
                {"clusterQueue": team_cluster_queue(team)},
                [namespace, cluster_queues[team_cluster_queue(team)]],
            )
        self.register_outputs({"clusterQueues": sorted(cluster_queues)})
