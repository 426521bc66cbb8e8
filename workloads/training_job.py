"""TrainingJob: a job from stack config as a PyTorchJob, MPIJob or TrainJob, with an S3-scoped
identity, running the trainer or its own program (workloads/stack_code.py).

A running job is restarted by any change to its pods' containers, so a job keeps the manifest it
was deployed with, image included, until its `revision` goes up (workloads/revisions.py).
"""

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext
from infra.core.iam import pod_identity_role
from infra.core.pools import Pool
from infra.jobs.config import JobConfig, job_role_resource_name
from infra.storage.bucket import TrainingBucket
from workloads.manifests import (
    API_VERSIONS,
    JobTarget,
    checkpoint_dir,
    mpi_job,
    network_policy,
    pytorch_job,
    train_job,
)
from workloads.revisions import held_back, kept_manifest
from workloads.stack_code import program

RENDER = {"PyTorchJob": pytorch_job, "MPIJob": mpi_job, "TrainJob": train_job}
# The stack output holding each job's deployed revision and manifest.
JOBS_OUTPUT = "jobs"


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
        deployed: pulumi.Output[dict],
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

        def render(namespace: str, bucket_name: str, image_ref) -> dict:
            checkpoint = checkpoint_dir(job, namespace, bucket_name)
            own, env = program(job, checkpoint)
            target = JobTarget(
                job, pool, namespace, image_ref, checkpoint, frozenset(storage),
                program=own, env=tuple(env.items()),
            )  # fmt: skip
            return RENDER[job.kind](target)

        # The image goes in as an Output leaf, not through this apply: in a preview that builds a
        # new image only the image fields are unknown, and the policy pack can read the rest.
        def kept(namespace: str, deployed_jobs: dict) -> dict | None:
            return kept_manifest(deployed_jobs.get(job.name), job.revision, job.kind, namespace)

        manifest = pulumi.Output.all(namespace_name, bucket.name, deployed).apply(
            lambda values: kept(values[0], values[2]) or render(values[0], values[1], image)
        )
        # What this revision holds back from the job: the stack's current manifest differs from
        # the one it keeps. Exported beside it; the plan lists it.
        self.held_back = pulumi.Output.all(namespace_name, bucket.name, deployed, image).apply(
            lambda values: held_back(
                kept(values[0], values[2]), render(values[0], values[1], values[3])
            )
        )
        self.manifest = manifest
        # A TrainJob's trainer and runtime reference are immutable (the Trainer's CRD): a new
        # revision is a new object of the same name, so the old one goes first.
        replace = ["spec"] if job.kind == "TrainJob" else None
        k8s.apiextensions.CustomResource(
            name,
            api_version=API_VERSIONS[job.kind],
            kind=job.kind,
            metadata=manifest["metadata"],
            spec=manifest["spec"],
            # The operators bring the CRD, Kueue's webhook suspends the job until admitted (a job
            # created before it would run unqueued) and its LocalQueue admits it, a TrainJob's
            # runtime must exist before it; on destroy all of them outlive the job. The identity
            # must exist before the first pod starts.
            opts=pulumi.ResourceOptions.merge(
                k8s_child,
                pulumi.ResourceOptions(
                    depends_on=[*controllers, *bucket.ready, account, identity],
                    replace_on_changes=replace,
                    delete_before_replace=bool(replace),
                ),
            ),
        )
        self.register_outputs({"manifest": manifest})
