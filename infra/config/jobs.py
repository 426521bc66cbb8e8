"""`jobs`: training jobs declared in stack config, checked with the trainer's own parser."""

from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from infra.config.base import K8sName, Model
from trainer.options import OptionsError, parse_options

# Pulumi auto-names a resource `<logical name>-<7 random hex>`.
AUTONAME_SUFFIX = 8


def job_role_resource_name(job_name: str) -> str:
    """Logical name of a job's Pod Identity role; Pulumi auto-names the IAM role from it."""
    return f"job-{job_name}-pods"


class JobConfig(Model):
    """A training job: the trainer on `nodePool`, admitted through a team's queue."""

    name: K8sName
    kind: Literal["PyTorchJob", "MPIJob"] = "PyTorchJob"
    node_pool: K8sName
    min_nodes: int = Field(default=1, ge=1, le=1000)
    max_nodes: int = Field(default=1, ge=1, le=1000)
    queue: K8sName  # a team name from queues.teams
    args: list[str] = Field(default_factory=list)  # trainer arguments (python -m trainer --help)
    checkpoint: Literal["s3", "fsx", "efs"] = "s3"
    max_restarts: int = Field(default=3, ge=0, le=100)
    # The job runs what it was given at this revision: the trainer image built then and its
    # manifest. A later trainer/ edit, args edit or program change reaches the running job only
    # when this number goes up, and then restarts it once (from its newest checkpoint).
    revision: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _range(self) -> "JobConfig":
        if self.name == "default":
            raise ValueError(
                "a job named default would bind its S3 role to every pod of the namespace "
                "(Pod Identity follows the service account, named after the job); allowed: "
                "any other name"
            )
        if self.min_nodes > self.max_nodes:
            raise ValueError(
                f"minNodes {self.min_nodes} > maxNodes {self.max_nodes}; "
                "allowed: minNodes <= maxNodes"
            )
        if self.kind == "MPIJob" and self.min_nodes != self.max_nodes:
            raise ValueError("an MPIJob is not elastic; allowed: minNodes == maxNodes")
        return self


def job_args_errors(job: "JobConfig") -> list[str]:
    """What the trainer would refuse in this job's arguments, by the trainer's own parser."""
    try:
        parse_options(job.args)
    except OptionsError as e:
        return [f"{e}; see python -m trainer --help"]
    if "--checkpoint-dir" in job.args:
        return ["--checkpoint-dir is set by the platform from `checkpoint`; allowed: leave it out"]
    return []
