"""TrainingRuntimes: a ClusterTrainingRuntime per NodePool, what self-service TrainJobs run on.

One per pool, `torch-<pool>`, because a runtime pins where its pods go and what they ask for: the
pool's node selector and tolerations, every GPU and EFA interface of its smallest node, a
/dev/shm of its size. A TrainJob picks its pool by picking its runtime; it may override its
trainer's image, arguments, environment and node count, little else of the pods. The hybrid
machines have none: their job pods are sized per job (HybridPool). Each runtime's pods are those
a stack job on the pool gets (workloads/manifests.py pod_template), run as the team's
self-service identity (infra/teams/jobs_identity.py).

Day two: a change to a runtime's containers restarts every running TrainJob on it that does not set
the changed field itself (infra/operators/tests/trainer_rules.py). So runtimes keep the manifest
they were deployed with, trainer image included, until `runtimes.revision` goes up
(workloads/revisions.py), and the plan lists what that holds back.
"""

import pulumi
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext
from infra.core.pools import image_target
from infra.jobs.runtimes import RuntimesConfig
from infra.karpenter.config import NodePoolConfig
from infra.storage.bucket import TrainingBucket
from workloads.manifests import API_VERSIONS, runtime_name, training_runtime
from workloads.revisions import held_back, kept_manifest

KIND = "ClusterTrainingRuntime"
# The stack output holding each runtime's deployed revision and manifest.
RUNTIMES_OUTPUT = "runtimes"


class TrainingRuntimes(pulumi.ComponentResource):
    runtimes: dict[str, pulumi.Resource]  # pool name -> its runtime
    manifests: dict[str, pulumi.Output[dict]]  # runtime name -> the manifest it runs
    held_back: dict[str, pulumi.Output[list[str]]]  # runtime name -> what its revision holds back

    def __init__(
        self,
        name: str,
        pools: list[NodePoolConfig],
        config: RuntimesConfig,
        images: dict[str, pulumi.Output[str]],  # by Dockerfile target (image_target)
        bucket: TrainingBucket,
        storage: set[str],  # the shared file systems the team namespaces have claims of
        cluster: ClusterContext,
        trainer: pulumi.Resource,  # its CRDs and validating webhook come first, go last
        deployed: pulumi.Output[dict],  # this output as the last update exported it
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:workloads:TrainingRuntimes", name, None, opts)
        self.runtimes, self.manifests, self.held_back = {}, {}, {}
        for pool in pools:
            runtime = runtime_name(pool)
            image = images[image_target(pool)]

            def render(bucket_name: str, image_ref, pool=pool) -> dict:
                return training_runtime(pool, image_ref, frozenset(storage), bucket_name)

            def kept(deployed_runtimes: dict, runtime=runtime) -> dict | None:
                return kept_manifest(deployed_runtimes.get(runtime), config.revision, KIND)

            # The image stays an Output leaf, as a job's does (workloads/training_job.py).
            manifest = pulumi.Output.all(bucket.name, deployed).apply(
                lambda values, render=render, kept=kept, image=image: (
                    kept(values[1]) or render(values[0], image)
                )
            )
            self.held_back[runtime] = pulumi.Output.all(bucket.name, deployed, image).apply(
                lambda values, render=render, kept=kept: held_back(
                    kept(values[1]), render(values[0], values[2])
                )
            )
            self.manifests[runtime] = manifest
            self.runtimes[pool.name] = k8s.apiextensions.CustomResource(
                f"{name}-{pool.name}",
                api_version=API_VERSIONS[KIND],
                kind=KIND,
                metadata=manifest["metadata"],
                spec=manifest["spec"],
                opts=cluster.in_cluster(self, trainer, *bucket.ready),
            )
        self.register_outputs({})
