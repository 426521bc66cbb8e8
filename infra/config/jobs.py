"""`jobs`: training jobs declared in stack config, checked with the trainer's own parser."""

import re
from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from infra.config.base import K8sName, Model
from trainer.options import OptionsError, parse_options

# Pulumi auto-names a resource `<logical name>-<7 random hex>`.
AUTONAME_SUFFIX = 8
# The ServiceAccount of self-service TrainJobs in every team namespace (the pools'
# ClusterTrainingRuntimes name it): its Pod Identity role may use the namespace's checkpoints.
SELF_SERVICE_ACCOUNT = "self-service-jobs"
DEFAULT_MAX_RESTARTS = 3
# A TrainJob's name is an RFC 1035 label: Trainer v2.3's CRD rule (metadata.name must start with
# a letter), stricter than the other kinds'.
TRAINJOB_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def job_role_resource_name(job_name: str) -> str:
    """Logical name of a job's Pod Identity role; Pulumi auto-names the IAM role from it."""
    return f"job-{job_name}-pods"


def team_jobs_role_resource_name(team: str) -> str:
    """Logical name of a team's self-service Pod Identity role (SELF_SERVICE_ACCOUNT)."""
    return f"team-{team}-jobs"


class JobConfig(Model):
    """A training job: the trainer on `nodePool`, admitted through a team's queue."""

    name: K8sName = Field(
        description="The job's name (not `default`: its Pod Identity role follows the service "
        "account named after it)."
    )
    kind: Literal["PyTorchJob", "MPIJob", "TrainJob"] = Field(
        default="PyTorchJob",
        description="An elastic PyTorchJob (torchrun, c10d), an MPIJob (mpirun; not elastic) or "
        "a TrainJob (Kubeflow Trainer v2 on its pool's ClusterTrainingRuntime; not elastic, "
        "not on the hybrid machines, checkpoints in s3 or efs).",
    )
    node_pool: K8sName = Field(
        description="A pool of nodePools, or `hybrid` (the hybrid machines: one pod per "
        "machine, checkpoint s3)."
    )
    min_nodes: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="The elastic range's low end (MPIJob, TrainJob: = maxNodes).",
    )
    max_nodes: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="Pods, one per node, at most the pool's maxNodes (hybrid: its machines).",
    )
    queue: K8sName = Field(
        description="A team of queues.teams: its namespace and LocalQueue; the job must fit "
        "what that queue can ever admit."
    )
    args: list[str] = Field(
        default_factory=list,
        description="The trainer's arguments, checked by the trainer's own parser (python -m "
        "trainer --help); not --checkpoint-dir, which the platform sets from `checkpoint`.",
    )
    checkpoint: Literal["s3", "fsx", "efs"] = Field(
        default="s3",
        description="Where checkpoints go: s3://<bucket>/checkpoints/<namespace>/<job>/, or the "
        "team's FSx or EFS claim (/fsx/checkpoints/<job>, /efs/checkpoints/<job>).",
    )
    max_restarts: int = Field(
        default=DEFAULT_MAX_RESTARTS,
        ge=0,
        le=100,
        description="Worker-group restarts torchrun allows (a TrainJob: its pool's runtime "
        f"allows {DEFAULT_MAX_RESTARTS}).",
    )
    revision: int = Field(
        default=1,
        ge=1,
        description="The job runs what it was given at this revision: the trainer image built "
        "then and its manifest. A later trainer/ edit, args edit or program change reaches the "
        "running job only when this number goes up, and then restarts it once (from its newest "
        "checkpoint).",
    )

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
        if self.name == SELF_SERVICE_ACCOUNT:
            raise ValueError(
                f"a job named {SELF_SERVICE_ACCOUNT} would run as the team's self-service "
                "identity (the service account the runtimes name); allowed: any other name"
            )
        if self.kind == "MPIJob" and self.min_nodes != self.max_nodes:
            raise ValueError("an MPIJob is not elastic; allowed: minNodes == maxNodes")
        if self.kind == "TrainJob":
            self._train_job()
        return self

    def _train_job(self) -> None:
        if self.min_nodes != self.max_nodes:
            raise ValueError(
                "a TrainJob is not elastic (Kubeflow Trainer v2.3 has no elastic PyTorch); "
                "allowed: minNodes == maxNodes, or kind PyTorchJob for an elastic job"
            )
        if not TRAINJOB_NAME.match(self.name):
            raise ValueError(
                f"a TrainJob's name must start with a letter (the Trainer's CRD), {self.name!r} "
                "does not; allowed: a name starting with a-z"
            )
        if self.checkpoint == "fsx":
            raise ValueError(
                "a TrainJob's pods are its runtime's, which prepare no folder on FSx (its root "
                "is root's); allowed: checkpoint s3 or efs, or kind PyTorchJob"
            )
        if "max_restarts" in self.model_fields_set and self.max_restarts != DEFAULT_MAX_RESTARTS:
            raise ValueError(
                f"a TrainJob restarts as its pool's runtime allows ({DEFAULT_MAX_RESTARTS} "
                "times); allowed: leave maxRestarts out, or kind PyTorchJob"
            )


def job_args_errors(job: "JobConfig") -> list[str]:
    """What the trainer would refuse in this job's arguments, by the trainer's own parser."""
    try:
        parse_options(job.args)
    except OptionsError as e:
        return [f"{e}; see .venv/bin/python -m trainer --help"]
    if "--checkpoint-dir" in job.args:
        return ["--checkpoint-dir is set by the platform from `checkpoint`; allowed: leave it out"]
    return []
