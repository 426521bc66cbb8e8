"""A stack job's own program instead of the trainer: `code` (a folder of this repository) or
`command` (in the job's `image`, else the trainer's).

`code` becomes an image: the folder over the trainer image of the job's pool, its requirements
and setup installed as root at build time, pushed by `pulumi up` to <cluster>/job-code, and run
by trainer.user_code in place (--code-dir), so a stack job gets the contract `devctl submit`
gives (CHECKPOINT_DIR, TENSORBOARD_DIR, OUTPUT_DIR, torchrun's variables, SIGTERM). An image,
where `devctl submit` sends a snapshot to the team's file system: `pulumi up` runs with the
stack's AWS rights, not as a member in the team's namespace, and an image is what the day-two
rules already keep per revision (ECR keeps older builds, workloads/revisions.py the manifest
naming one): a folder edit is a new image, held back until the job's revision goes up.

The folder goes in as Docker sends it: all of it less its .dockerignore (not .gitignore, which
`devctl submit` and `make job-local` also honour).
"""

import json
import shlex
from collections.abc import Sequence

import pulumi

from infra.core.context import ClusterContext
from infra.core.paths import PROJECT_DIR
from infra.images.container_image import EcrRepository, repository_name, source_tag
from infra.jobs.config import JobConfig, UserCode
from trainer import TRAINER_UID
from trainer.user_code import command, contract_paths
from workloads.image import trainer_tag

CODE_DIR = "/opt/code"
# trainer/Dockerfile's WORKDIR, where `python -m trainer.user_code` finds the trainer package;
# trainer.user_code then runs the script in CODE_DIR.
TRAINER_DIR = "/opt/trainer"
REPOSITORY = "job-code"  # its ECR repository: <cluster>/job-code
BASE_ARG = "BASE"
PIP_INSTALL = [
    "python",
    "-m",
    "pip",
    "install",
    "--no-cache-dir",
    "-r",
]  # the build argument naming the trainer image it starts from


def dockerfile(code: UserCode) -> str:
    """The build of a job's folder: the trainer image, the folder at CODE_DIR (root's, read-only
    to the trainer), its requirements and setup installed, the trainer's user last. The job's
    variables are build arguments, so the install sees them (a PIP_INDEX_URL)."""
    lines = [f"ARG {BASE_ARG}", f"FROM ${{{BASE_ARG}}}", *(f"ARG {name}" for name in code.env)]
    lines += ["USER 0", f"COPY . {CODE_DIR}", f"WORKDIR {CODE_DIR}"]
    installs = [shlex.join([*PIP_INSTALL, code.requirements])] if code.requirements else []
    installs += [code.setup] if code.setup else []
    if installs:  # one layer, stopped by the first step that fails
        lines.append(f"RUN {json.dumps(['sh', '-c', '; '.join(['set -e', *installs])])}")
    lines += [f"WORKDIR {TRAINER_DIR}", f"USER {TRAINER_UID}"]
    return "\n".join(lines) + "\n"


def code_tag(job: JobConfig, base_target: str) -> str:
    """The tag of a job's code image: its name and what makes pulumi-docker-build rebuild it
    (the folder, the Dockerfile, the variables, the trainer image it starts from)."""
    code = job.code
    base = trainer_tag(base_target)
    return source_tag(
        job.name,
        PROJECT_DIR / code.workdir,
        None,
        inline=dockerfile(code),
        build_args=(base, *sorted(code.env.items())),
    )


def program(job: JobConfig, checkpoint: str) -> tuple[tuple[str, ...] | None, dict[str, str]]:
    """What a stack job's pods run, and their own variables: None for the trainer."""
    if job.code:
        launch = list(job.code.run)
        return tuple(command(checkpoint, launch, code_dir=CODE_DIR)), dict(job.code.env)
    if job.command:
        # trainer.user_code sets these for code; a command gets them from the pod.
        return tuple(job.command), contract_paths(checkpoint)
    return None, {}


def runs(job: JobConfig) -> str:
    """What a job runs, in a line of the plan."""
    if job.code:
        needs = [n for n in (job.code.requirements, job.code.setup and "setup") if n]
        extra = f" (+ {', '.join(needs)})" if needs else ""
        return f"{job.code.workdir}: {' '.join(job.code.run)}{extra}"
    if job.command:
        return f"{' '.join(job.command)} in {job.image or 'the trainer image'}"
    return f"the trainer {' '.join(job.args)}".rstrip()


class CodeImages(pulumi.ComponentResource):
    """The images of the stack jobs that name `code`, each with the trainer image target of its
    pool: refs[job] is repository@sha256:digest."""

    refs: dict[str, pulumi.Output[str]]

    def __init__(
        self,
        name: str,
        code_jobs: Sequence[tuple[JobConfig, str]],
        trainer_refs: dict[str, pulumi.Output[str]],
        cluster: ClusterContext,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:workloads:CodeImages", name, None, opts)
        repository = EcrRepository(
            name,
            repository_name(cluster.config_name, REPOSITORY),
            cluster.tags,
            pulumi.ResourceOptions(parent=self),
            cluster.data,
        )
        self.refs = {}
        for job, target in code_jobs:
            self.refs[job.name] = repository.push(
                f"{name}-{job.name}",
                PROJECT_DIR / job.code.workdir,
                code_tag(job, target),
                inline=dockerfile(job.code),
                build_args={BASE_ARG: trainer_refs[target], **job.code.env},
            )
        self.register_outputs({"refs": self.refs})
