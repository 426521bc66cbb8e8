"""TeamJobsIdentity: what a team's self-service jobs may do in AWS.

The pools' ClusterTrainingRuntimes run every TrainJob as SELF_SERVICE_ACCOUNT of its namespace. In
a team's namespace that service account has a Pod Identity role that may read and write the team's
checkpoints, s3://<bucket>/checkpoints/<namespace>/ (where the runtimes put them), and nothing else
in S3. A team's jobs may thus read each other's checkpoints, never another team's. Stack jobs keep
a role of their own, on one job's prefix (workloads/training_job.py).

The role and its association name the namespace by its name from config, not through the
Namespace object, so that the namespace can depend on them: on destroy its jobs stop, and save
their last checkpoint, while their credentials still work. The ServiceAccount itself lives in the
namespace (account_in), after it.
"""

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext
from infra.core.iam import pod_identity_role
from infra.jobs.config import SELF_SERVICE_ACCOUNT, team_jobs_role_resource_name
from infra.kueue.config import TeamConfig
from infra.storage.bucket import TrainingBucket
from infra.storage.config import CHECKPOINT_PREFIX


class TeamJobsIdentity(pulumi.ComponentResource):
    ready: list[pulumi.Resource]  # what the team's namespace waits for and outlives

    def __init__(
        self,
        name: str,
        team: TeamConfig,
        bucket: TrainingBucket,
        cluster: ClusterContext,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:TeamJobsIdentity", name, None, opts)
        self._name, self._cluster = name, cluster
        namespace = team.namespace_name
        child = pulumi.ResourceOptions(parent=self)
        role = pod_identity_role(
            team_jobs_role_resource_name(team.name),
            cluster.name,
            namespace,
            SELF_SERVICE_ACCOUNT,
            [],
            cluster.tags,
            child,
            inline_policy=bucket.prefix_policy(f"{CHECKPOINT_PREFIX}{namespace}"),
        )
        association = aws.eks.PodIdentityAssociation(
            name,
            cluster_name=cluster.name,
            namespace=namespace,
            service_account=SELF_SERVICE_ACCOUNT,
            role_arn=role.arn,
            tags=cluster.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*role.ready, *bucket.ready]),
        )
        self.ready = [association, *role.ready]
        self.register_outputs({})

    def account_in(self, namespace: k8s.core.v1.Namespace) -> None:
        """The service account in the team's namespace (no API token: the pods never call the
        Kubernetes API, Pod Identity mounts its own)."""
        k8s.core.v1.ServiceAccount(
            self._name,
            metadata={"name": SELF_SERVICE_ACCOUNT, "namespace": namespace.metadata.name},
            automount_service_account_token=False,
            opts=self._cluster.in_cluster(self),
        )
