"""UsageRecorder: a CronJob on the system nodes that records which nodes ran and which jobs held
quota (usagerecorder/recorder.py says what and where), its namespace, image and RBAC.

Its rights, and nothing more: list Nodes (cluster-wide: they are cluster-scoped); in namespace
usage-records, its own, list and write the node records; in each team namespace, list Kueue
Workloads and pods and list and write ConfigMaps (the job records). Team members read the
ConfigMaps of their own namespace (infra/teams/access.py), never write them, and cannot read
usage-records: a team cannot change its record or read another's. DevServer namespaces are not
recorded: the DevServers operator keeps their usage (devservers/savings.py).
"""

import pulumi
import pulumi_kubernetes as k8s

from infra.billing.config import BillingConfig
from infra.billing.facts import USAGE_RECORDS
from infra.core.context import ClusterContext
from infra.core.data_holders import annotated
from infra.core.nodes import POOL_LABEL
from infra.core.paths import PROJECT_DIR
from infra.core.rbac import binding, rule
from infra.core.system_cronjob import system_cronjob
from infra.images.container_image import images
from usagerecorder.records import RECORD_NAMESPACE

NAME = "usage-recorder"
NAMESPACE = RECORD_NAMESPACE
CONTEXT = PROJECT_DIR / "usagerecorder"
IMAGE_TARGET = "recorder"
# A node or an admission that vanished between two runs is recorded up to the run that last saw
# it: the interval is the record's resolution.
SCHEDULE = "*/5 * * * *"
RUN_DEADLINE_S = 120
CLUSTER_RULES = [rule([""], ["nodes"], ["list"])]
RECORD_RULES = [rule([""], ["configmaps"], ["list", "create", "patch", "delete"])]
TEAM_RULES = [
    *RECORD_RULES,
    rule(["kueue.x-k8s.io"], ["workloads"], ["list"]),
    rule([""], ["pods"], ["list"]),
]


def recorder_args(
    config: BillingConfig, team_namespaces: list[str], job_pods: dict[str, dict[str, str]]
) -> list[str]:
    """`job_pods`: per job kind the labels its operator puts on the job's pods, `{name}` for the
    job's name (devservers/job_status.py KINDS: deploy/program.py passes them)."""
    return [
        f"--record-namespace={NAMESPACE}",
        f"--namespaces={','.join(team_namespaces)}",
        f"--pool-label={POOL_LABEL}",
        *(
            f"--job-pods={kind}=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
            for kind, labels in sorted(job_pods.items())
        ),
        f"--keep-days={config.usage_record_days}",
    ]


class UsageRecorder(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        config: BillingConfig,
        team_namespaces: dict[str, k8s.core.v1.Namespace],  # namespace name -> the resource
        job_pods: dict[str, dict[str, str]],
        cluster: ClusterContext,
        after: list[pulumi.Resource],  # Kueue (its Workload kind) and the pools' NodePools
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:UsageRecorder", name, None, opts)
        image = images(
            config.usage_recorder_image, f"{name}-image", cluster, NAME, CONTEXT,
            [IMAGE_TARGET], self,
        )[IMAGE_TARGET]  # fmt: skip
        # Deleting the namespace deletes the node records: a data holder.
        namespace = k8s.core.v1.Namespace(
            name,
            metadata=annotated(
                {"name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
                USAGE_RECORDS,
            ),
            opts=cluster.holding(USAGE_RECORDS, self),
        )
        account = k8s.core.v1.ServiceAccount(
            name,
            metadata={"name": NAME, "namespace": NAMESPACE},
            opts=cluster.in_cluster(self, namespace),
        )
        subjects = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
        rights = [account]
        cluster_role = k8s.rbac.v1.ClusterRole(
            name, metadata={"name": NAME}, rules=CLUSTER_RULES, opts=cluster.in_cluster(self)
        )
        rights.append(
            binding(
                k8s.rbac.v1.ClusterRoleBinding,
                name,
                {"name": NAME},
                ("ClusterRole", NAME),
                subjects,
                cluster.in_cluster(self, cluster_role, account),
            )  # fmt: skip
        )
        where = {NAMESPACE: (namespace, RECORD_RULES)}
        where |= {ns: (resource, TEAM_RULES) for ns, resource in team_namespaces.items()}
        for ns, (resource, rules) in where.items():
            meta = {"name": NAME, "namespace": ns}
            role = k8s.rbac.v1.Role(
                f"{name}-{ns}", metadata=meta, rules=rules, opts=cluster.in_cluster(self, resource)
            )
            rights.append(
                binding(
                    k8s.rbac.v1.RoleBinding,
                    f"{name}-{ns}",
                    meta,
                    ("Role", NAME),
                    subjects,
                    cluster.in_cluster(self, role, account),
                )  # fmt: skip
            )
        system_cronjob(
            NAME,
            NAMESPACE,
            "recorder",
            image,
            recorder_args(config, sorted(team_namespaces), job_pods),
            SCHEDULE,
            RUN_DEADLINE_S,
            # After its rights and what it reads; deleted before them.
            cluster.in_cluster(self, *rights, *after),
        )
        self.register_outputs({"image": image})
