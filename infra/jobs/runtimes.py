"""`runtimes`: the pools' ClusterTrainingRuntimes, which self-service TrainJobs run on."""

from pydantic import Field

from infra.core.config import Model


class RuntimesConfig(Model):
    """A ClusterTrainingRuntime per NodePool, `torch-<pool>`: the pods a stack job on the pool
    gets, for TrainJobs the teams submit themselves (Kubeflow SDK or kubectl)."""

    revision: int = Field(
        default=1,
        ge=1,
        description="The runtimes keep what they were given at this revision: the trainer image "
        "built then and their pod template. A trainer/ edit, a pool edit or a program change "
        "reaches them only when this number goes up, and then restarts once each running "
        "TrainJob on a runtime whose containers changed (from its newest checkpoint).",
    )
