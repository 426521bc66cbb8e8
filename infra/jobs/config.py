"""`jobs`: training jobs declared in stack config: the platform's trainer (checked with its own
parser), your own code from a folder of the repository, or your own image's command."""

import re
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from infra.core.config import K8sName, Model
from trainer.launch import entry_point
from trainer.options import OptionsError, parse_options
from trainer.options import parser as trainer_parser
from trainer.user_code import CONTRACT_VARIABLES

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


# What torchrun sets in every worker over the pod's own (torch 2.13: torch/distributed/elastic/
# agent/server/local_elastic_agent.py _start_workers): a job's value would never be seen.
TORCHRUN_VARIABLES = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
     "MASTER_PORT", "TORCHELASTIC_RUN_ID"}
)  # fmt: skip


class UserCode(Model):
    """Your own script and what it needs: `devctl submit`'s task, and a stack job's `code`."""

    workdir: str = Field(
        default=".",
        description="The folder every pod gets: relative to the task file, or (a stack job's "
        "code) to the repository, inside it.",
    )
    run: list[str] = Field(
        min_length=1,
        description="The script and its arguments, or -m and a module: [train.py, --lr, '3e-4'].",
    )
    requirements: str | None = Field(
        default=None, description="A requirements file in the folder, installed once per content."
    )
    setup: str = Field(default="", description="A shell command that installs more.")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Variables of the script's processes (and of the install), e.g. PIP_INDEX_URL.",
    )

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        reserved = sorted(
            k
            for k in value
            if k.startswith("PET_") or k in CONTRACT_VARIABLES or k in TORCHRUN_VARIABLES
        )
        if reserved:
            raise ValueError(f"{', '.join(reserved)}: set by the platform; allowed: other names")
        bad = [k for k in value if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise ValueError(f"{bad[0]!r}: allowed: names of letters, digits and _")
        return value

    @model_validator(mode="after")
    def _run(self) -> "UserCode":
        if self.run[0] == "-m" and len(self.run) < 2:
            raise ValueError("run: -m needs a module; allowed: [-m, package.module, ...]")
        return self


# An image by digest: what a restarted pod pulls is what its revision deployed.
IMAGE_BY_DIGEST = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")


class JobConfig(Model):
    """A training job: the trainer on `nodePool`, admitted through a team's queue."""

    name: K8sName = Field(
        description="The job's name (not `default`: its Pod Identity role follows the service "
        "account named after it)."
    )
    kind: Literal["PyTorchJob", "MPIJob", "TrainJob"] = Field(
        default="TrainJob",
        description="A TrainJob (Kubeflow Trainer v2 on its pool's ClusterTrainingRuntime; not "
        "elastic, not on the hybrid machines, checkpoints in s3 or efs), an MPIJob (mpirun; "
        "not elastic) or a PyTorchJob (torchrun, c10d; on the training operator v1, which "
        "upstream no longer maintains, so only for an elastic range or on the hybrid machines, "
        "where no TrainJob runs: docs/users/jobs.md).",
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
    code: UserCode | None = Field(
        default=None,
        description="Your own code instead of the trainer: a folder of this repository, built "
        "with its requirements and setup into an image over the trainer's (`pulumi up` builds "
        "it), run as `devctl submit` runs it (trainer.user_code: CHECKPOINT_DIR, "
        "TENSORBOARD_DIR, OUTPUT_DIR, torchrun, SIGTERM). PyTorchJob or TrainJob; checkpoint "
        "efs or fsx.",
    )
    command: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Your own command instead of the trainer, run as given in every pod (an "
        "MPIJob: by mpirun on every rank) with torchrun's PET_* variables and CHECKPOINT_DIR, "
        "TENSORBOARD_DIR and OUTPUT_DIR set; in `image`, else the trainer's image.",
    )
    image: str | None = Field(
        default=None,
        description="Your own image for `command`, by digest (repository@sha256:...): a "
        "restarted pod runs what its revision deployed. Its user must be able to run as uid "
        "10001 (Pod Security restricted).",
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
        elastic = self.min_nodes < self.max_nodes
        if self.kind == "MPIJob" and elastic:
            raise ValueError("an MPIJob is not elastic; allowed: minNodes == maxNodes")
        if self.kind == "TrainJob":
            self._train_job()
        self._program()
        return self

    def _program(self) -> None:
        """One program: the trainer's arguments, your code, or your command (and image)."""
        given = [key for key in ("args", "code", "command") if getattr(self, key)]
        if len(given) > 1:
            raise ValueError(
                f"{' and '.join(given)}: one program per job; allowed: args (the trainer), "
                "code (a folder) or command (with image)"
            )
        if self.image and not self.command:
            raise ValueError("image needs command: what to run in it; allowed: both, or neither")
        if self.image and not IMAGE_BY_DIGEST.match(self.image):
            raise ValueError(
                f"image {self.image!r} is not by digest; allowed: repository@sha256:<64 hex> "
                "(docker buildx imagetools inspect REF prints it)"
            )
        if self.code is None:
            return
        if self.kind == "MPIJob":
            raise ValueError(
                "code runs under torchrun, an MPIJob under mpirun; allowed: kind PyTorchJob or "
                "TrainJob, or command for an MPIJob"
            )
        if self.checkpoint == "s3":
            raise ValueError(
                "code writes CHECKPOINT_DIR with plain files, which s3:// is not; allowed: "
                "checkpoint efs or fsx"
            )
        folder = PurePosixPath(self.code.workdir)
        if folder.is_absolute() or ".." in folder.parts:
            raise ValueError(
                f"code.workdir {self.code.workdir!r}: allowed: a folder inside the repository, "
                "relative to it (e.g. examples/your-own-code)"
            )

    def _train_job(self) -> None:
        if self.min_nodes != self.max_nodes:
            raise ValueError(
                "a TrainJob (the default kind) is not elastic: Kubeflow Trainer v2.3 has no "
                "elastic PyTorch; allowed: minNodes == maxNodes, or kind PyTorchJob for an "
                "elastic job"
            )
        if not TRAINJOB_NAME.match(self.name):
            raise ValueError(
                f"a TrainJob's name must start with a letter (the Trainer's CRD), {self.name!r} "
                "does not; allowed: a name starting with a-z"
            )
        if self.checkpoint == "fsx":
            raise ValueError(
                "a TrainJob's pods are its runtime's, which prepare no folder on FSx (its root "
                "is root's); allowed: checkpoint s3 or efs, or an elastic PyTorchJob"
            )
        if "max_restarts" in self.model_fields_set and self.max_restarts != DEFAULT_MAX_RESTARTS:
            raise ValueError(
                f"a TrainJob restarts as its pool's runtime allows ({DEFAULT_MAX_RESTARTS} "
                "times); allowed: leave maxRestarts out, or an elastic PyTorchJob"
            )


def code_errors(job: "JobConfig", repository: Path, builds_images: bool) -> list[str]:
    """What `pulumi up` could not build from a job's code: a folder, script or requirements file
    the repository lacks, or a stack that builds no images (image.uri)."""
    code = job.code
    if code is None:
        return []
    if not builds_images:
        return [
            "this stack builds no images (image.uri is set), and code is built into one; "
            "allowed: command with your own image, or leave image.uri out"
        ]
    folder = repository / code.workdir
    if not folder.is_dir():
        return [f"code.workdir {code.workdir!r} is no folder of the repository ({repository})"]
    found = entry_point(code.run)
    problems = []
    if found and found[0] == "script" and not (folder / found[1]).is_file():
        problems.append(f"code.run: no script {found[1]!r} in {code.workdir}")
    if code.requirements and not (folder / code.requirements).is_file():
        problems.append(f"code.requirements: no file {code.requirements!r} in {code.workdir}")
    return problems


def job_args_errors(job: "JobConfig") -> list[str]:
    """What the trainer would refuse in this job's arguments, by the trainer's own parser."""
    try:
        parse_options(job.args)
    except OptionsError as e:
        return [f"{e}; see .venv/bin/python -m trainer --help"]
    # As the trainer reads it: `--checkpoint-dir=/x` and argparse's abbreviations (`--checkpoint-d
    # /x`) set it too, and the job's value would win over the platform's.
    given = trainer_parser()
    given.set_defaults(checkpoint_dir=None)
    if given.parse_args(job.args).checkpoint_dir is not None:
        return ["--checkpoint-dir is set by the platform from `checkpoint`; allowed: leave it out"]
    return []
