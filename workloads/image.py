"""TrainerImage: the trainer image in ECR, built from trainer/Dockerfile, or a prebuilt digest."""

import pulumi

from infra.core.config import ImageConfig
from infra.core.context import ClusterContext
from infra.core.paths import PROJECT_DIR
from infra.core.pools import image_target
from infra.images.container_image import images, repository_name, source_tag
from infra.stack.config import StackConfig

# The build context is the trainer's folder alone: the image needs nothing else, and
# pulumi-docker-build rebuilds whenever anything in its context changes.
CONTEXT = PROJECT_DIR / "trainer"
DOCKERFILE = CONTEXT / "Dockerfile"
TRAINER = "trainer"  # its ECR repository: <cluster>/trainer
RUNTIME = "runtime"  # the target without EFA's libraries (image_target)


def trainer_tag(target: str) -> str:
    """The tag `pulumi up` pushes the trainer image's `target` under (see source_tag)."""
    return source_tag(target, CONTEXT, DOCKERFILE)


def trainer_repository(cluster_name: str) -> str:
    """The trainer's ECR repository name."""
    return repository_name(cluster_name, TRAINER)


def trainer_image_repository(config: StackConfig, account: str) -> str:
    """Where the stack's trainer images live, registry included: the prebuilt image.uri's
    repository, else the ECR repository `pulumi up` builds into in `account`."""
    if config.image.uri:
        return config.image.uri.partition("@")[0]
    registry = f"{account}.dkr.ecr.{config.region}.amazonaws.com"
    return f"{registry}/{trainer_repository(config.cluster.name)}"


def stack_targets(config: StackConfig) -> list[str]:
    """The targets a stack builds: those its jobs run, those of every NodePool, whose
    ClusterTrainingRuntime (workloads/training_runtimes.py) and fabric check (workloads/
    nccl_check.py: all_reduce_perf) run the pool's target, and `runtime` for the teams'
    TensorBoards (workloads/tensorboard.py)."""
    image_pools = [config.job_pool(job) for job in config.jobs] + list(config.node_pools)
    tensorboards = [RUNTIME] if any(t.tensorboard for t in config.queues.teams) else []
    return sorted({image_target(pool) for pool in image_pools} | set(tensorboards))


class TrainerImage(pulumi.ComponentResource):
    """The trainer image: `refs[target]` is repository@sha256:digest for each Dockerfile target
    jobs need (`runtime`; `efa` for jobs on EFA pools), or the prebuilt `image.uri` for all."""

    refs: dict[str, pulumi.Output[str]]

    def __init__(
        self,
        name: str,
        config: ImageConfig,
        targets: list[str],
        cluster: ClusterContext,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:workloads:TrainerImage", name, None, opts)
        self.refs = images(config, name, cluster, TRAINER, CONTEXT, targets, self)
        self.register_outputs({"refs": self.refs})
