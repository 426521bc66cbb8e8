"""TrainingJob: a job from stack config as a PyTorchJob or MPIJob, with an S3-scoped identity."""

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.components.bucket import TrainingBucket
from infra.components.context import ClusterContext
from infra.components.iam import pod_identity_role
from infra.config import JobConfig, Pool, job_role_resource_name
from workloads.manifests import (
    API_VERSIONS,
    JobTarget,
    checkpoint_dir,
    mpi_job,
    network_policy,
    pytorch_job,
)

RENDER = {"PyTorchJob": pytorch_job, "MPIJob": mpi_job}


class TrainingJob(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        job: JobConfig,
        pool: Pool,
        namespace: k8s.core.v1.Namespace,
        image: pulumi.Input[str],
        bucket: TrainingBucket,
        cluster: ClusterContext,
        storage: set[str],
        controllers: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:workloads:TrainingJob", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        k8s_child = cluster.in_cluster(self)
        namespace_name = namespace.metadata.name
        # The job's pods may read and write its own checkpoint prefix, and nothing else in S3.
        prefix = namespace_name.apply(lambda ns: f"checkpoints/{ns}/{job.name}")
        role = pod_identity_role(
            job_role_resource_name(job.name),
            cluster.name,
            namespace_name,
            job.name,
            [],
            cluster.tags,
            child,
            inline_policy=prefix.apply(lambda p: bucket.prefix_policy(p)),
        )
        account = k8s.core.v1.ServiceAccount(
            name, metadata={"name": job.name, "namespace": namespace_name}, opts=k8s_child
        )
        identity = aws.eks.PodIdentityAssociation(
            name,
            cluster_name=cluster.name,
            namespace=namespace_name,
            service_account=job.name,
            role_arn=role.arn,
            tags=cluster.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=role.ready),
        )
        policy = namespace_name.apply(lambda ns: network_policy(job, ns))
        k8s.networking.v1.NetworkPolicy(
            name, metadata=policy["metadata"], spec=policy["spec"], opts=k8s_child
        )
        # The image goes in as an Output leaf, not through this apply: in a preview that builds a
        # new image only the image fields are unknown, and the policy pack can read the rest.
        manifest = pulumi.Output.all(namespace_name, bucket.name).apply(
            lambda values: RENDER[job.kind](
                JobTarget(
                    job,
                    pool,
                    values[0],
                    image,
                    checkpoint_dir(job, values[0], values[1]),
                    frozenset(storage),
                )
            )
        )
        k8s.apiextensions.CustomResource(
            name,
            api_version=API_VERSIONS[job.kind],
            kind=job.kind,
            metadata=manifest["metadata"],
            spec=manifest["spec"],
            # The operators bring the CRD, Kueue's webhook suspends the job until admitted (a job
            # created before it would run unqueued) and its LocalQueue admits it; on destroy all of
            # them outlive the job. The identity must exist before the first pod starts.
            opts=pulumi.ResourceOptions.merge(
                k8s_child,
                pulumi.ResourceOptions(depends_on=[*controllers, *bucket.ready, account, identity]),
            ),
        )
        self.register_outputs({})
