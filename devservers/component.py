"""DevServers: the DevServer CRDs, their operator, the flavors, and one namespace per user.

Each user in `devServers.users[]` gets namespace dev-<user> (Pod Security "restricted", labelled
with their team so their team's ClusterQueue admits it), a LocalQueue `dev`, a ResourceQuota of
servers, GPUs, CPU, memory and home storage (the gp3 volumes of their servers, kept ones
included; homes on the hybrid machines' own disks are not counted), RBAC that
lets them manage DevServers and exec/port-forward there and nowhere else, and an EKS access
entry mapping their IAM principal to that RBAC. The operator runs on the
system nodes and may write only in the dev-* namespaces.
"""

import json

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from devservers.api import (
    API_VERSION,
    CPU_QUOTA,
    DCGM_LABELS,
    DCGM_PORT,
    FLAVORS,
    GPU_REQUESTS,
    GROUP,
    LOCAL_QUEUE,
    MEMORY_QUOTA,
    OWNER_LABEL,
    QUOTA,
    SERVER_COUNT,
    SERVERS,
    crds,
    flavor_object,
    storage_quota,
    user_namespace,
)
from devservers.day_two import user_holder
from devservers.render import NAMESPACE_SLOT
from infra.core.catalog import HOURS_PER_MONTH, RegionPrices
from infra.core.context import ClusterContext
from infra.core.data_holders import annotated
from infra.core.network_policies import admit_pods, platform_namespace
from infra.core.nodes import SYSTEM_PLACEMENT
from infra.core.paths import PROJECT_DIR
from infra.core.pools import Pool
from infra.core.rbac import CONNECT, READ, binding, group, rule
from infra.core.tags import NAMESPACE_TAG, as_list
from infra.gpu.metrics import NAMESPACE as DCGM_NAMESPACE
from infra.hybrid.homes import STORAGE_CLASS as HYBRID_HOME_STORAGE_CLASS
from infra.hybrid.placement import node_selector, tolerations
from infra.images.container_image import images
from infra.kueue.config import TeamConfig
from infra.kueue.queues import (
    API_VERSION as KUEUE_API_VERSION,
)
from infra.kueue.queues import (
    QUEUE_ACCESS_LABEL,
    TEAM_LABEL,
    team_cluster_queue,
)
from infra.stack.dev_servers import DevServersConfig
from infra.storage.block_storage import HOME_STORAGE_CLASS
from infra.storage.facts import SSH_LOAD_BALANCERS_ANNOTATION
from infra.vpc.facts import classic_load_balancer_per_hour

NAMESPACE = "devservers-system"
OPERATOR = "devserver-operator"
# The image's build context is the devservers package alone (devservers/.dockerignore).
CONTEXT = PROJECT_DIR / "devservers"
IMAGE_TARGET = "operator"
USERS_GROUP = "dev:users"  # every DevServer user, for the read-only flavor catalog
HEALTH_PORT = 8080
OPERATOR_LABELS = {"app.kubernetes.io/name": OPERATOR}
METRICS_PORT = 8081  # Prometheus text: idle stops, restarts, what they save (devservers.metrics)
RESTRICTED = {
    f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")
}


def user_group(user: str) -> str:
    return f"dev:{user}"


WRITE = [*READ, "create", "patch", "update", "delete"]
CHILD = ["get", "create", "patch", "delete"]  # what the reconcile does to a server's children

# What the operator calls in a user namespace (bound there by RoleBindings, not cluster-wide):
# kopf watches DevServers and pods and patches its annotations, status and spec.stopped.
OPERATOR_NAMESPACED_RULES = [
    rule([GROUP], [SERVERS], [*READ, "patch"]),
    rule([GROUP], [f"{SERVERS}/status"], ["patch"]),
    # Owner references with blockOwnerDeletion need this (OwnerReferencesPermissionEnforcement).
    rule([GROUP], [f"{SERVERS}/finalizers"], ["update"]),
    rule(["apps"], ["statefulsets"], CHILD),
    rule([""], ["services", "configmaps"], CHILD),
    # The servers' usage records' copies (devservers.savings.LEDGER_PREFIX): listed to drop the
    # expired ones when a server is deleted.
    rule([""], ["configmaps"], ["list"]),
    rule(["networking.k8s.io"], ["networkpolicies"], CHILD),  # who reaches a server's pods
    # Each server's SSH host key: made once, then read for its public half (devservers.controller
    # _host_key). No list, update or delete: the garbage collector deletes it with its server,
    # and rotating it is an administrator's delete. `get` adds nothing the operator lacks: it
    # could mount any Secret here in a pod it renders and exec into it.
    rule([""], ["secrets"], ["get", "create"]),
    rule([""], ["persistentvolumeclaims"], ["list", "patch"]),
    rule([""], ["pods"], ["list", "watch"]),
    rule([""], ["pods/exec"], CONNECT),
    # Events about a server: kopf's warnings, the operator's refusals, idle stops and restarts.
    rule([""], ["events"], ["create"]),
    rule(["kueue.x-k8s.io"], ["workloads"], ["list"]),  # status.kueue
]
# Cluster-wide, read-only: flavors, and what kopf watches to find namespaces and resources.
OPERATOR_CLUSTER_RULES = [
    rule([GROUP], [FLAVORS], READ),
    # The node a server's pod runs on: its instance type and size, for the savings record.
    rule([""], ["nodes"], ["get"]),
    rule([""], ["namespaces"], ["list", "watch"]),
    rule(["apiextensions.k8s.io"], ["customresourcedefinitions"], ["list", "watch"]),
]
# A user in their own namespace: their servers, and reaching into them. No Secrets: devctl
# checks a server's SSH host key against its public half in the server's status, which only
# the operator writes (the status subresource).
USER_RULES = [
    rule([GROUP], [SERVERS], WRITE),
    rule([GROUP], [f"{SERVERS}/status"], ["get"]),
    rule([""], ["pods", "services", "configmaps", "events", "resourcequotas"], READ),
    rule([""], ["pods/log"], ["get"]),
    rule([""], ["pods/exec", "pods/portforward"], CONNECT),
    rule([""], ["persistentvolumeclaims"], [*READ, "delete"]),
    rule(["apps"], ["statefulsets"], READ),
]


def flavor_manifest(flavor, pool: Pool, efs: bool) -> dict:
    """The DevServerFlavor for a config flavor: its pool's placement (placement.py), where its
    servers' homes go (gp3 volumes on EC2 pools, directories on the hybrid machines' disks:
    infra/hybrid/homes.py), and whether they mount the shared EFS claim: only where the stack has
    EFS (`efs`: storage.efs.enabled) and never on the hybrid machines, which cannot reach it. A pod
    naming a claim that does not exist is never scheduled."""
    return flavor_object(
        flavor.name,
        pool.name,
        node_selector(pool),
        tolerations(pool),
        flavor.gpus,
        flavor.cpu,
        flavor.memory_gib,
        home_storage_class=HYBRID_HOME_STORAGE_CLASS if pool.hybrid else HOME_STORAGE_CLASS,
        shared_file_system=efs and not pool.hybrid,
    )


class DevServers(pulumi.ComponentResource):
    namespaces: dict[str, k8s.core.v1.Namespace]  # dev-<user> -> its Namespace

    def __init__(
        self,
        name: str,
        config: DevServersConfig,
        flavor_pools: dict[str, Pool],  # flavor name -> the pool it names
        teams: list[TeamConfig],
        cluster: ClusterContext,
        queues: list[pulumi.Resource],  # what a LocalQueue waits for: Kueue and the ClusterQueues
        # What a user's pods need until they are gone: Kueue and the provisioners of their volumes
        # (the CSI drivers; on the hybrid machines, the local-path provisioner and the machines).
        namespace_prerequisites: list[pulumi.Resource],
        gpu_metrics: pulumi.Resource | None,
        efs: bool,  # the stack has EFS, whose claim (efs-shared) is in every user's namespace
        # Principals that are team members too, and their team groups (infra/teams/access.py): EKS
        # keeps one access entry per principal, so the user's carries them.
        member_groups: dict[str, list[str]],
        # The stack's trainer repository, registry included: servers may always run its images.
        trainer_repository: str,
        prices: RegionPrices,  # the flavors' instance types' prices, for the savings record
        opts: pulumi.ResourceOptions | None = None,
    ):
        # The type token is part of every child's URN: it keeps the `infra` it had before the
        # component moved here, or `pulumi up` would replace every resource of a running stack.
        super().__init__("training-platform:infra:DevServers", name, None, opts)

        # Deleting the DevServer CRD deletes every server, whose pods carry Kueue's finalizers
        # and are confirmed gone by the kubelets of the pools' nodes: on destroy the CRDs go
        # while Kueue, the drivers and the nodes still run.
        definitions = [
            k8s.apiextensions.v1.CustomResourceDefinition(
                f"{name}-crd-{crd['spec']['names']['plural']}",
                metadata=crd["metadata"],
                spec=crd["spec"],
                opts=cluster.in_cluster(self, *queues, *namespace_prerequisites),
            )
            for crd in crds()
        ]
        flavors = []
        for flavor in config.flavors:
            manifest = flavor_manifest(flavor, flavor_pools[flavor.name], efs)
            flavors.append(
                k8s.apiextensions.CustomResource(
                    f"{name}-flavor-{flavor.name}",
                    api_version=API_VERSION,
                    kind="DevServerFlavor",
                    metadata=manifest["metadata"],
                    spec=manifest["spec"],
                    opts=cluster.in_cluster(self, *definitions),
                )
            )

        image = images(
            config.operator_image, f"{name}-operator-image", cluster, OPERATOR, CONTEXT,
            [IMAGE_TARGET], self,
        )[IMAGE_TARGET]  # fmt: skip
        operator_namespace = k8s.core.v1.Namespace(
            f"{name}-system",
            metadata={"name": NAMESPACE, "labels": RESTRICTED},
            opts=cluster.in_cluster(self),
        )
        # The operator serves no webhook; its probes come from its node, and its metrics port
        # (every user's servers, flavors and prices) is for no one else.
        platform_namespace(f"{name}-system", NAMESPACE, cluster, self, [operator_namespace])
        account = k8s.core.v1.ServiceAccount(
            f"{name}-operator",
            metadata={"name": OPERATOR, "namespace": NAMESPACE},
            opts=cluster.in_cluster(self, operator_namespace),
        )
        subject = [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}]
        cluster_role = k8s.rbac.v1.ClusterRole(
            f"{name}-operator-cluster",
            metadata={"name": f"{OPERATOR}-cluster"},
            rules=OPERATOR_CLUSTER_RULES,
            opts=cluster.in_cluster(self),
        )
        binding(
            k8s.rbac.v1.ClusterRoleBinding,
            f"{name}-operator-cluster",
            {"name": f"{OPERATOR}-cluster"},
            ("ClusterRole", f"{OPERATOR}-cluster"),
            subject,
            cluster.in_cluster(self, cluster_role, account),
        )
        namespaced_role = k8s.rbac.v1.ClusterRole(
            f"{name}-operator-namespaced",
            metadata={"name": f"{OPERATOR}-namespaced"},
            rules=OPERATOR_NAMESPACED_RULES,
            opts=cluster.in_cluster(self),
        )
        user_role = k8s.rbac.v1.ClusterRole(
            f"{name}-user",
            metadata={"name": "devserver-user"},
            rules=USER_RULES,
            opts=cluster.in_cluster(self),
        )
        flavor_reader = k8s.rbac.v1.ClusterRole(
            f"{name}-flavor-reader",
            metadata={"name": "devserver-flavor-reader"},
            rules=[rule([GROUP], [FLAVORS], ["get", "list"])],
            opts=cluster.in_cluster(self),
        )
        binding(
            k8s.rbac.v1.ClusterRoleBinding,
            f"{name}-flavor-reader",
            {"name": "devserver-flavor-reader"},
            ("ClusterRole", "devserver-flavor-reader"),
            [group(USERS_GROUP)],
            cluster.in_cluster(self, flavor_reader),
        )
        if gpu_metrics is not None:
            # The operator finds each node's DCGM exporter to read its servers' GPU use.
            dcgm_role = k8s.rbac.v1.Role(
                f"{name}-operator-dcgm",
                metadata={"name": f"{OPERATOR}-dcgm", "namespace": DCGM_NAMESPACE},
                rules=[rule([""], ["pods"], ["list"])],
                opts=cluster.in_cluster(self, gpu_metrics),
            )
            binding(
                k8s.rbac.v1.RoleBinding,
                f"{name}-operator-dcgm",
                {"name": f"{OPERATOR}-dcgm", "namespace": DCGM_NAMESPACE},
                ("Role", f"{OPERATOR}-dcgm"),
                subject,
                cluster.in_cluster(self, dcgm_role, account),
            )
            # ... and reads them over the network, where the monitoring namespace admits only its
            # own pods otherwise (infra/gpu/metrics.py).
            k8s.networking.v1.NetworkPolicy(
                f"{name}-operator-dcgm",
                metadata={"name": f"{OPERATOR}-reads-dcgm", "namespace": DCGM_NAMESPACE},
                spec=admit_pods(DCGM_LABELS, NAMESPACE, OPERATOR_LABELS, DCGM_PORT),
                opts=cluster.in_cluster(self, gpu_metrics),
            )

        teams_by_name = {t.name: t for t in teams}
        self.namespaces = {}
        bindings = []
        for user in config.users:
            namespace = self.namespaces[user_namespace(user.name)] = self._user(
                name,
                user,
                teams_by_name[user.team],
                config.cpu_and_memory_quota(user),
                cluster,
                queues,
                namespace_prerequisites,
                bool(config.ssh_load_balancer_cidrs),
                member_groups.get(user.iam_principal_arn, []),
            )
            bind = cluster.in_cluster(self, namespace, user_role)
            bindings += [
                binding(
                    k8s.rbac.v1.RoleBinding,
                    f"{name}-{user.name}-user",
                    {"name": "devserver-user", "namespace": user_namespace(user.name)},
                    ("ClusterRole", "devserver-user"),
                    [group(user_group(user.name))],
                    bind,
                ),
                binding(
                    k8s.rbac.v1.RoleBinding,
                    f"{name}-{user.name}-operator",
                    {"name": OPERATOR, "namespace": user_namespace(user.name)},
                    ("ClusterRole", f"{OPERATOR}-namespaced"),
                    subject,
                    cluster.in_cluster(self, namespace, namespaced_role, account),
                ),
            ]
        # After the flavors: the operator reads each one's home StorageClass.
        self._deployment(
            name,
            image,
            config,
            {
                "DEVSERVERS_VPC_CIDR": str(cluster.vpc.cidr),
                "DEVSERVERS_ALLOWED_IMAGES": ",".join(
                    [trainer_repository, *config.allowed_image_registries]
                ),
                "DEVSERVERS_REQUIRE_IMAGE_DIGEST": str(config.require_image_digest).lower(),
                # What an SSH load balancer bills under: the stack's tags and its user's
                # namespace (the operator fills it in).
                "DEVSERVERS_LB_TAGS": as_list({**cluster.tags, NAMESPACE_TAG: NAMESPACE_SLOT}),
                # What a server bills while it exists, running or stopped: its homes (gp3),
                # and an SSH load balancer if it asks for one.
                "DEVSERVERS_KEPT_PRICES": json.dumps(
                    {
                        "homeGibHour": prices.usd("ebsGp3PerGibMonth") / HOURS_PER_MONTH,
                        "sshLoadBalancerHour": classic_load_balancer_per_hour(
                            len(cluster.vpc.public_subnets), prices.usd
                        ),
                    },
                    sort_keys=True,
                ),
                "DEVSERVERS_PRICES": json.dumps(
                    {
                        kind.name: prices.instance(kind.name)
                        for pool in {p.name: p for p in flavor_pools.values()}.values()
                        if not pool.hybrid
                        for kind in pool.types
                    },
                    sort_keys=True,
                ),
            },
            cluster.in_cluster(
                self, account, *definitions, *flavors, *bindings, *cluster.controller_prerequisites
            ),
        )
        self.register_outputs({"operatorImage": image})

    def _user(
        self,
        name,
        user,
        team: TeamConfig,
        cpu_and_memory: tuple[int, int],
        cluster: ClusterContext,
        queues,
        prerequisites,
        ssh_load_balancers: bool,
        team_groups: list[str],
    ):
        """dev-<user>: the namespace, its queue and quota, and the IAM principal's way in."""
        namespace_name = user_namespace(user.name)
        # Deleting it stops her servers and deletes their claims; the homes' volumes are kept
        # (HOME_STORAGE_CLASS retains them) for an administrator to release (docs: day two).
        holder = user_holder(user.name)
        namespace = k8s.core.v1.Namespace(
            f"{name}-ns-{user.name}",
            metadata=annotated(
                {
                    "name": namespace_name,
                    "labels": {
                        **RESTRICTED,
                        OWNER_LABEL: user.name,
                        # The team's ClusterQueue selects its namespaces by these labels.
                        TEAM_LABEL: team.name,
                        QUEUE_ACCESS_LABEL: str(not team.own_cluster_queue).lower(),
                    },
                    "annotations": {f"{GROUP}/email": user.email},
                },
                holder,
            ),
            opts=cluster.holding(holder, self, *prerequisites),
        )
        k8s.apiextensions.CustomResource(
            f"{name}-lq-{user.name}",
            api_version=KUEUE_API_VERSION,
            kind="LocalQueue",
            metadata={"name": LOCAL_QUEUE, "namespace": namespace_name},
            spec={"clusterQueue": team_cluster_queue(team)},
            opts=cluster.in_cluster(self, namespace, *queues),
        )
        metadata: dict = {"name": QUOTA, "namespace": namespace_name}
        if ssh_load_balancers:
            # Each server may ask for an SSH load balancer: the plan prices them up to the quota.
            metadata["annotations"] = {SSH_LOAD_BALANCERS_ANNOTATION: str(user.quota.servers)}
        cpu, memory_gib = cpu_and_memory
        k8s.core.v1.ResourceQuota(
            f"{name}-quota-{user.name}",
            metadata=metadata,
            spec={
                "hard": {
                    SERVER_COUNT: str(user.quota.servers),
                    # Extended resources take only a requests quota (GPU requests == limits).
                    GPU_REQUESTS: str(user.quota.gpus),
                    # Server pods ask for as much as they may use (requests == limits): both are
                    # capped, so no user takes the queue's CPU or memory for themself.
                    **{key: str(cpu) for key in CPU_QUOTA},
                    **{key: f"{memory_gib}Gi" for key in MEMORY_QUOTA},
                    # Every home, whether a server uses it or it was kept after a delete or a
                    # shrink: the plan's cost table prices this ceiling (infra/core/cost.py).
                    storage_quota(HOME_STORAGE_CLASS): f"{user.quota.home_gib}Gi",
                }
            },
            opts=cluster.in_cluster(self, namespace),
        )
        # No access policy: the user's rights are the RBAC bound to these groups, nothing more.
        aws.eks.AccessEntry(
            f"{name}-access-{user.name}",
            cluster_name=cluster.name,
            principal_arn=user.iam_principal_arn,
            kubernetes_groups=[user_group(user.name), USERS_GROUP, *team_groups],
            type="STANDARD",
            tags=cluster.tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        return namespace

    def _deployment(self, name, image, config: DevServersConfig, settings: dict, opts):
        """One replica (kopf --standalone: no peering) on the system nodes, restricted pod."""
        env = {
            "DEVSERVERS_SSH_CIDRS": ",".join(str(c) for c in config.ssh_load_balancer_cidrs),
            "DEVSERVERS_DCGM_NAMESPACE": DCGM_NAMESPACE,
            "DEVSERVERS_IDLE_GPU_PERCENT": str(config.idle.gpu_percent),
            "DEVSERVERS_IDLE_CPU_PERCENT": str(config.idle.cpu_percent),
            "DEVSERVERS_COUNTED_STOP_HOURS": str(config.idle.counted_stop_hours),
            "DEVSERVERS_METRICS_PORT": str(METRICS_PORT),
            **settings,
        }
        labels = OPERATOR_LABELS
        return k8s.apps.v1.Deployment(
            f"{name}-operator",
            metadata={"name": OPERATOR, "namespace": NAMESPACE, "labels": labels},
            spec={
                "replicas": 1,
                # Never two operators at once: kopf runs standalone, without peering.
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": OPERATOR,
                        **SYSTEM_PLACEMENT,
                        "securityContext": {
                            "runAsNonRoot": True,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [
                            {
                                "name": "operator",
                                "image": image,
                                "args": [
                                    "--namespace=dev-*",
                                    f"--liveness=http://0.0.0.0:{HEALTH_PORT}/healthz",
                                ],
                                "env": [{"name": k, "value": v} for k, v in env.items()],
                                "ports": [
                                    {"name": "health", "containerPort": HEALTH_PORT},
                                    {"name": "metrics", "containerPort": METRICS_PORT},
                                ],
                                "livenessProbe": {
                                    "httpGet": {"path": "/healthz", "port": HEALTH_PORT},
                                    "periodSeconds": 30,
                                },
                                "resources": {
                                    "requests": {"cpu": "100m", "memory": "256Mi"},
                                    "limits": {"memory": "512Mi"},
                                },
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                            }
                        ],
                    },
                },
            },
            opts=opts,
        )
