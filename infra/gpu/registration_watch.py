"""GpuRegistrationWatch: a CronJob on the system nodes that replaces GPU nodes whose GPUs never
register (the rule and why Karpenter does not: gpuwatch/watcher.py), its image and its RBAC.

It may list nodes, list and delete karpenter.sh NodeClaims, and create Events in `default`;
nothing else. It depends on the NodePools (and through them on Karpenter), so `pulumi destroy`
deletes it before them: it never runs against a cluster whose pools are being torn down.
"""

import math

import pulumi
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext
from infra.core.nodes import GPU_NODE_LABELS
from infra.core.paths import PROJECT_DIR
from infra.core.system_cronjob import system_cronjob
from infra.eks.config import KarpenterConfig
from infra.images.container_image import images
from infra.karpenter.cold_start import MARGIN, launch_seconds
from infra.karpenter.config import NodePoolConfig

NAMESPACE = "kube-system"
NAME = "gpu-registration-watch"
# The image's build context is the gpuwatch package alone (gpuwatch/.dockerignore).
CONTEXT = PROJECT_DIR / "gpuwatch"
IMAGE_TARGET = "watcher"
SCHEDULE = "*/5 * * * *"
# A run lists two collections and deletes a few objects: it ends in seconds. Killed after this,
# well before the next run would start.
RUN_DEADLINE_S = 120
# Where the API server keeps Events about cluster-scoped objects such as Nodes
# (pkg/apis/core/validation/events.go, legacyValidateEvent).
EVENT_NAMESPACE = "default"
CLUSTER_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
    {"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": ["list", "delete"]},
]
EVENT_RULES = [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


def registration_timeout(gpu_pools: list[NodePoolConfig]) -> int:
    """Seconds a GPU node may go without allocatable GPUs: the slowest pool's modelled launch
    (instance start, node Ready, device plugin advertising: infra/karpenter/cold_start.py) with
    the cold start's MARGIN, in whole minutes. Counted from the Node's creation, which comes after
    the instance started, so the boot itself is extra slack."""
    slowest = max(launch_seconds(t) for pool in gpu_pools for t in pool.types)
    return math.ceil(slowest * MARGIN / 60) * 60


def watcher_args(config: KarpenterConfig, gpu_pools: list[NodePoolConfig]) -> list[str]:
    seconds = config.gpu_registration_timeout_seconds or registration_timeout(gpu_pools)
    return [
        f"--pools={','.join(p.name for p in gpu_pools)}",
        "--node-selector=" + ",".join(f"{k}={v}" for k, v in GPU_NODE_LABELS.items()),
        f"--timeout-seconds={seconds}",
        f"--max-deletions={config.gpu_registration_max_deletions}",
    ]


class GpuRegistrationWatch(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        config: KarpenterConfig,
        gpu_pools: list[NodePoolConfig],
        cluster: ClusterContext,
        node_pools: list[pulumi.Resource],  # the GPU pools' NodePools: it deletes their claims
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:GpuRegistrationWatch", name, None, opts)

        image = images(
            config.gpu_registration_watch_image, f"{name}-image", cluster, NAME, CONTEXT,
            [IMAGE_TARGET], self,
        )[IMAGE_TARGET]  # fmt: skip
        account = k8s.core.v1.ServiceAccount(
            name, metadata={"name": NAME, "namespace": NAMESPACE}, opts=cluster.in_cluster(self)
        )
        subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
        role_ref = {"apiGroup": "rbac.authorization.k8s.io", "name": NAME}
        cluster_role = k8s.rbac.v1.ClusterRole(
            name, metadata={"name": NAME}, rules=CLUSTER_RULES, opts=cluster.in_cluster(self)
        )
        cluster_binding = k8s.rbac.v1.ClusterRoleBinding(
            name,
            metadata={"name": NAME},
            role_ref={**role_ref, "kind": "ClusterRole"},
            subjects=subject,
            opts=cluster.in_cluster(self, cluster_role, account),
        )
        event_meta = {"name": NAME, "namespace": EVENT_NAMESPACE}
        event_role = k8s.rbac.v1.Role(
            f"{name}-events", metadata=event_meta, rules=EVENT_RULES, opts=cluster.in_cluster(self)
        )
        event_binding = k8s.rbac.v1.RoleBinding(
            f"{name}-events",
            metadata=event_meta,
            role_ref={**role_ref, "kind": "Role"},
            subjects=subject,
            opts=cluster.in_cluster(self, event_role, account),
        )
        system_cronjob(
            NAME,
            NAMESPACE,
            "watcher",
            image,
            watcher_args(config, gpu_pools),
            SCHEDULE,
            RUN_DEADLINE_S,
            # Created after, and deleted before, its rights and the NodePools whose claims it
            # deletes (and so before Karpenter, which they depend on).
            cluster.in_cluster(self, cluster_binding, event_binding, *node_pools),
        )
        self.register_outputs({"image": image})
