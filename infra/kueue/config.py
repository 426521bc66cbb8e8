"""`queues`: teams, their Kueue queues, and what a job asks of its team's queue."""

import math
from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from infra.core.config import IamPrincipalArn, K8sName, Model
from infra.core.pools import Pool
from infra.jobs.config import JobConfig

# Namespaces the cluster or this program's controllers own: a team namespace there would mix
# job pods (and their Pod Identity roles) with system components.
SYSTEM_NAMESPACES = (
    "default",
    "kube-node-lease",
    "kube-public",
    "kube-system",
    "kubeflow",
    "kubeflow-system",
    "kueue-system",
    "monitoring",
    "mpi-operator",
    "local-path-storage",
    "devservers-system",
    "nvidia-device-plugin",
    "usage-records",
)
# DevServer users' namespaces are dev-<user> (devservers/api.py NAMESPACE_PREFIX): no team's.
USER_NAMESPACE_PREFIX = "dev-"


# The name of a team's TensorBoard: its Deployment, Service and ServiceAccount
# (workloads/tensorboard.py).
TENSORBOARD = "tensorboard"


class TeamConfig(Model):
    """A team submitting jobs: a namespace with a LocalQueue, optionally its own ClusterQueue."""

    name: K8sName = Field(
        description="The team's name: its LocalQueue, and what jobs name as their queue "
        "(label kueue.x-k8s.io/queue-name)."
    )
    namespace: K8sName | None = Field(
        default=None,
        description="Its namespace (default: the team name); not a system namespace (kube-*, "
        "default, kueue-system, kubeflow, kubeflow-system, monitoring, mpi-operator, "
        "local-path-storage, devservers-system, nvidia-device-plugin, usage-records).",
    )
    own_cluster_queue: bool = Field(
        default=False,
        description="A ClusterQueue of its own in the platform cohort: no quota of its own, it "
        "borrows unused platform quota up to borrowingLimitPercent of each pool's ceiling and "
        "is reclaimed first when others need it.",
    )
    borrowing_limit_percent: int = Field(
        default=100,
        ge=1,
        le=100,
        description="With ownClusterQueue: the share of each pool's ceiling it may borrow.",
    )
    members: list[IamPrincipalArn] = Field(
        default_factory=list,
        description="IAM roles or users, each once, that may submit, watch and delete the "
        "team's jobs (PyTorchJob, MPIJob, TrainJob) in its namespace, read their pods, logs, "
        "events and Kueue Workloads, and reach its TensorBoard: nothing outside the namespace. "
        "An IAM Identity Center role keeps its path (arn:aws:iam::<account>:role/aws-reserved/"
        "sso.amazonaws.com/<region>/AWSReservedSSO_<permission set>_<suffix>). Each principal "
        "gets one EKS access entry, mapped to the group team:<name> (a DevServer user's entry "
        "carries it too).",
    )
    image_repository: bool = Field(
        default=False,
        description="An ECR repository <cluster>/teams/<name> (immutable tags, scanned on "
        "push) the team's members push their own images to and run them with devctl submit "
        "--image; its repository policy lets members push and pull (they need "
        "ecr:GetAuthorizationToken in their own IAM policy to log in), the nodes pull it.",
    )
    tensorboard: bool = Field(
        default=True,
        description="A TensorBoard in the namespace, on the system nodes, that reads the "
        "curves of all the team's jobs (s3://<bucket>/checkpoints/<namespace>, and the team's "
        "EFS and FSx checkpoints read-only); members reach it with kubectl port-forward -n "
        "<namespace> svc/tensorboard 6006.",
    )

    @property
    def namespace_name(self) -> str:
        return self.namespace or self.name

    @model_validator(mode="after")
    def _members_once(self) -> "TeamConfig":
        repeated = sorted({m for m in self.members if self.members.count(m) > 1})
        if repeated:
            raise ValueError(f"members repeats {', '.join(repeated)}; allowed: each ARN once")
        return self


class QueuesConfig(Model):
    """Kueue: one platform ClusterQueue whose quota per pool is the pool's ceiling, and teams."""

    cohort: K8sName = Field(
        default="training-platform", description="The Kueue cohort of the ClusterQueues."
    )
    reclaim_within_cohort: Literal["Never", "LowerPriority", "Any"] = Field(
        default="Any", description="Kueue preemption: reclaiming lent quota within the cohort."
    )
    within_cluster_queue: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] = Field(
        default="LowerPriority", description="Kueue preemption within one ClusterQueue."
    )
    teams: list[TeamConfig] = Field(
        default_factory=list,
        description="Teams: each a namespace with a LocalQueue, names and namespaces unique.",
    )

    @model_validator(mode="after")
    def _unique(self) -> "QueuesConfig":
        for team in self.teams:
            ns = team.namespace_name
            if ns in SYSTEM_NAMESPACES or ns.startswith(("kube-", USER_NAMESPACE_PREFIX)):
                raise ValueError(
                    f"team {team.name}'s namespace {ns!r} is a system or DevServer user's "
                    f"namespace; allowed: any other name (not kube-*, {USER_NAMESPACE_PREFIX}*, "
                    f"nor {', '.join(SYSTEM_NAMESPACES)})"
                )
        for what, values in (
            ("names", [t.name for t in self.teams]),
            ("namespaces", [t.namespace_name for t in self.teams]),
        ):
            repeated = sorted({v for v in values if values.count(v) > 1})
            if repeated:
                raise ValueError(
                    f"team {what} {', '.join(repeated)} repeat; allowed: unique {what}"
                )
        return self


# The resources Kueue's quotas cover, as the messages name them (memory in GiB).
QUOTA_RESOURCES = {"nvidia.com/gpu": "nvidia.com/gpu", "cpu": "cpu", "memory": "GiB memory"}


def job_demand(job: "JobConfig", pool: Pool) -> dict[str, float]:
    """What the whole job's pods ask of its queue, per resource of QUOTA_RESOURCES."""
    cpu, memory_gib = pool.job_pod_requests()
    per_pod = {"nvidia.com/gpu": pool.gpus_per_node if pool.gpu else 0, "cpu": cpu}
    return {r: job.max_nodes * amount for r, amount in {**per_pod, "memory": memory_gib}.items()}


def queue_quota(pool: Pool, team: TeamConfig) -> dict[str, float]:
    """The most of each resource in `pool` that the team's queue can ever admit."""
    ceiling = pool.ceiling()
    amounts = {"nvidia.com/gpu": ceiling.gpus, "cpu": ceiling.vcpu, "memory": ceiling.memory_gib}
    if team.own_cluster_queue:
        return {r: math.ceil(a * team.borrowing_limit_percent / 100) for r, a in amounts.items()}
    return amounts


def queue_shortfall(job: "JobConfig", pool: Pool, team: TeamConfig) -> str | None:
    """`needs N <resource> ... at most M` for the first resource the job asks more of than the
    team's queue can ever admit (Kueue admits a job only when every resource fits), else None.
    On a NodePool, GPUs (or vCPU) bind first; the hybrid machines differ from one another."""
    wanted, quota = job_demand(job, pool), queue_quota(pool, team)
    for resource, name in QUOTA_RESOURCES.items():
        if wanted[resource] > quota[resource]:
            return (
                f"needs {wanted[resource]:g} {name} in pool {pool.name} but team {team.name}'s "
                f"queue can admit at most {quota[resource]:g}"
            )
    return None
