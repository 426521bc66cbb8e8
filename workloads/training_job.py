"""TrainingJob: a job from stack config as a PyTorchJob or MPIJob, with an S3-scoped identity.

A running job is restarted by any change to its pods' containers (Kueue v0.19.2 re-creates the
Workload of a job whose pod template no longer matches it: pkg/controller/jobframework/
reconciler.go ensureOneWorkload, stopJob), so a job keeps the manifest it was deployed with,
image included, until its `revision` goes up. The manifests live in this stack's own `jobs`
output, read back through a StackReference to the stack itself (the outputs of its last
completed update: pulumi/pulumi pkg/resource/deploy/builtins.go readStackReference).
"""

import json

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
# The stack output holding each job's deployed revision and manifest.
JOBS_OUTPUT = "jobs"


def deployed_jobs() -> pulumi.Output[dict]:
    """{job: {revision, manifest}} as this stack's last completed update exported them."""
    stack = f"{pulumi.get_organization()}/{pulumi.get_project()}/{pulumi.get_stack()}"
    reference = pulumi.StackReference("deployed", stack_name=stack)
    return reference.get_output(JOBS_OUTPUT).apply(lambda jobs: jobs or {})


def kept_manifest(job: JobConfig, namespace: str, deployed: dict) -> dict | None:
    """The manifest the job runs now, when this update must keep it: same revision, kind and
    namespace (a job moved to another namespace or kind is a new object anyway)."""
    entry = deployed.get(job.name)
    if not entry or entry.get("revision") != job.revision:
        return None
    manifest = entry.get("manifest") or {}
    same_place = manifest.get("kind") == job.kind and (
        (manifest.get("metadata") or {}).get("namespace") == namespace
    )
    return manifest if same_place else None


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
            target = JobTarget(
                job, pool, namespace, image_ref, checkpoint_dir(job, namespace, bucket_name),
                frozenset(storage),
            )  # fmt: skip
            return RENDER[job.kind](target)

        # The image goes in as an Output leaf, not through this apply: in a preview that builds a
        # new image only the image fields are unknown, and the policy pack can read the rest.
        manifest = pulumi.Output.all(namespace_name, bucket.name, deployed).apply(
            lambda values: (
                kept_manifest(job, values[0], values[2]) or render(values[0], values[1], image)
            )
        )
        # What this revision holds back from the job: the stack's current manifest differs from
        # the one it keeps. Exported beside it; the plan lists it.
        self.held_back = pulumi.Output.all(namespace_name, bucket.name, deployed, image).apply(
            lambda values: held_back(
                kept_manifest(job, values[0], values[2]), render(values[0], values[1], values[3])
            )
        )
        self.manifest = manifest
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
        self.register_outputs({"manifest": manifest})


def held_back(kept: dict | None, current: dict) -> list[str]:
    """The parts of the job's current manifest its kept one lacks: its image, its trainer
    arguments, the rest of its pods and spec."""
    if kept is None or kept == current:
        return []
    changed = []
    kept_images, current_images = _containers(kept), _containers(current)
    if [c.get("image") for c in kept_images] != [c.get("image") for c in current_images]:
        changed.append("image")
    if [c.get("command") for c in kept_images] != [c.get("command") for c in current_images]:
        changed.append("trainer arguments")
    strip = [_without_containers(kept), _without_containers(current)]
    if strip[0] != strip[1]:
        changed.append("pods and spec")
    return changed or ["pods and spec"]


def _replica_specs(manifest: dict) -> dict:
    spec = manifest.get("spec") or {}
    return spec.get("pytorchReplicaSpecs") or spec.get("mpiReplicaSpecs") or {}


def _containers(manifest: dict) -> list[dict]:
    return [
        c
        for replica in _replica_specs(manifest).values()
        for kind in ("initContainers", "containers")
        for c in replica["template"]["spec"].get(kind, [])
    ]


def _without_containers(manifest: dict) -> dict:
    stripped = json.loads(json.dumps(manifest))
    for c in _containers(stripped):
        c.pop("image", None)
        c.pop("command", None)
    return stripped
