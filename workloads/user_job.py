"""A user's own code as a job: what `devctl submit` sends, from a folder and a few choices.

The choices are a Task: the command line's options, or the same keys in a task file kept with
the code (`devctl submit -f task.yaml`). The job is the platform's own kind of job on the pool,
rendered by workloads.manifests like a stack job (queue label, do-not-disrupt, the pool's
placement, GPUs and EFA, /dev/shm, the team's claims, Pod Security restricted, the grace
period), with trainer.user_code as its program:

- a TrainJob on the pool's ClusterTrainingRuntime for a fixed number of nodes, or an elastic
  PyTorchJob (torchrun, c10d) for `nodes: MIN:MAX`, Trainer v2 having no elastic training;
- the pods run as the team's self-service identity (the runtimes' service account);
- the code snapshot, the dependency environments and the job's folder (CHECKPOINT_DIR, its
  tensorboard/ and outputs/) are on the team's shared file system, EFS where the stack has it,
  else FSx: plain files every pod of the job sees, private to the team (an EFS access point
  per namespace, FSx's directory per team) and written with the member's Kubernetes rights
  alone (devservers.submit), where S3 would need AWS rights on a laptop or a pod per read.
"""

import re
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator

from infra.core.config import K8sName, did_you_mean, one_line
from infra.core.pools import Pool
from infra.jobs.config import DEFAULT_MAX_RESTARTS, SELF_SERVICE_ACCOUNT, JobConfig, UserCode
from mesh.workdir import DEFAULT_MAX_MB, Archive
from trainer import user_code
from workloads.manifests import JobTarget, mounted_checkpoint_dir, pytorch_job, train_job

# Where a team's code snapshots and dependency environments are kept, per shared file system:
# on EFS beside the checkpoints (the team's TensorBoard walks /efs/checkpoints); on FSx in the
# team's own directory, the one a team may write.
CODE_STORES = {"efs": "/efs/user-code", "fsx": "/fsx/checkpoints/.user-code"}
STORE_PREFERENCE = ("efs", "fsx")


class TaskError(ValueError):
    """A message for the user: one line per problem."""


def parse_nodes(value: Any) -> tuple[int, int]:
    """`2` or `"2"`: two nodes; `"2:4"`: elastic, between two and four."""
    text = str(value)
    found = re.fullmatch(r"([0-9]+)(?::([0-9]+))?", text)
    if not found or isinstance(value, bool):
        raise ValueError(f"{text!r}: allowed: N or MIN:MAX, e.g. 2 or 2:4")
    low = int(found[1])
    high = int(found[2] or low)
    if not 1 <= low <= high:
        raise ValueError(f"{text!r}: allowed: 1 <= MIN <= MAX")
    return low, high


class Task(UserCode):
    """What to run and where: `devctl submit`'s options, or a task file's keys (the script and
    what it needs are UserCode's, as a stack job's `code`)."""

    name: K8sName | None = Field(
        default=None,
        description="The job's name; the same name again resumes from its checkpoints "
        "(default: the folder's name and a random suffix).",
    )
    pool: K8sName = Field(description="The node pool (kubectl get clustertrainingruntimes).")
    nodes: int | str = Field(default=1, description="N, or MIN:MAX for an elastic job.")
    image: str | None = Field(
        default=None, description="Your image (default: the pool's runtime image)."
    )
    queue: K8sName | None = Field(
        default=None, description="The team's LocalQueue (default: the namespace's one)."
    )
    exclude: list[str] = Field(default_factory=list, description="Globs left out of the folder.")
    max_size_mb: int = Field(
        default=DEFAULT_MAX_MB, ge=1, description="Refuse a folder bigger than this."
    )
    max_restarts: int = Field(
        default=DEFAULT_MAX_RESTARTS,
        ge=0,
        le=100,
        description="Restarts of the worker group (elastic jobs).",
    )

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: int | str) -> int | str:
        parse_nodes(value)
        return value

    @property
    def node_range(self) -> tuple[int, int]:
        return parse_nodes(self.nodes)

    @property
    def elastic(self) -> bool:
        low, high = self.node_range
        return low != high


def task_from(values: dict[str, Any], source: str) -> Task:
    """A Task from a task file's keys merged with options; every bad key named on its line."""
    try:
        return Task.model_validate(values)
    except ValidationError as e:
        allowed = [f.alias or n for n, f in Task.model_fields.items()]
        lines = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"]) or "(top)"
            if err["type"] == "extra_forbidden":
                said = f"unknown key; {did_you_mean(str(err['loc'][-1]), allowed)}allowed: " + (
                    ", ".join(allowed)
                )
            elif err["type"] == "missing":
                said = "missing; this key is required"
            else:
                said = err["msg"].removeprefix("Value error, ")
            lines.append(one_line(f"  {key}: {said}"))
        raise TaskError(f"invalid task in {source}:\n" + "\n".join(lines)) from None


def code_store(storage: frozenset[str]) -> str:
    """The shared file system that holds a team's code, environments and job folders."""
    found = next((kind for kind in STORE_PREFERENCE if kind in storage), None)
    if found is None:
        raise TaskError(
            "the stack mounts no shared file system into jobs (storage.efs or storage.fsx): "
            "your code and checkpoints need one; ask your platform engineers"
        )
    return found


def program(task: Task, store: str, code: str, folder: str) -> tuple[str, ...]:
    """The pods' command: trainer.user_code with the snapshot, the environment's inputs and the
    job's folder, then torchrun's program (torchrun's nodes and ranks come from the operator's
    PET_* variables)."""
    return tuple(
        user_code.command(
            folder, task.run, (CODE_STORES[store], code), None, task.requirements, task.setup
        )
    )


def local_run(
    code: UserCode, name: str, folder: Path, archive: Archive, store: Path, python: str
) -> tuple[list[str], dict[str, str], str]:
    """(the command, its variables, what it stored) that runs `code` here as a job's pods run it:
    trainer.user_code over the folder's snapshot in `store`, the job's folder in
    `store`/checkpoints/`name`. `devctl submit --local` and `make job-local` run it."""
    store = store.resolve()  # the script runs elsewhere (a fresh working directory)
    sha, written = user_code.store_snapshot(store / "user-code", archive.data)
    launch = ["--standalone", f"--nproc-per-node={user_code.LOCAL_NPROC}", *code.run]
    job_folder = store / "checkpoints" / name
    command = user_code.command(
        str(job_folder),
        launch,
        (str(store / "user-code"), sha),
        None,
        code.requirements,
        code.setup,
        python,
    )
    stored = "stored" if written else "unchanged, already stored"
    said = f"{archive.summary()} from {folder} ({stored} as {sha[:12]}); job folder {job_folder}"
    return command, {**user_code.LOCAL_ENV, **code.env}, said


def render(
    task: Task,
    name: str,
    pool: Pool,
    namespace: str,
    queue: str,
    image: str,
    code: str,
    storage: frozenset[str],
) -> dict:
    """The job `devctl submit` creates: a TrainJob, or a PyTorchJob when elastic."""
    store = code_store(storage)
    low, high = task.node_range
    if high > pool.max_nodes:
        raise TaskError(
            f"nodes {task.nodes}: pool {pool.name} has at most {pool.max_nodes} nodes; "
            f"allowed: up to {pool.max_nodes}"
        )
    kind = "PyTorchJob" if task.elastic else "TrainJob"
    job = JobConfig.model_validate(
        {
            "name": name,
            "kind": kind,
            "nodePool": pool.name,
            "minNodes": low,
            "maxNodes": high,
            "queue": queue,
            "checkpoint": store,
            **({"maxRestarts": task.max_restarts} if task.elastic else {}),
        }
    )
    folder = mounted_checkpoint_dir(job)
    target = JobTarget(
        job,
        pool,
        namespace,
        image,
        folder,
        storage,
        service_account_name=SELF_SERVICE_ACCOUNT,
        program=program(task, store, code, folder),
        env=tuple(task.env.items()),
    )
    return pytorch_job(target) if task.elastic else train_job(target)


def runtime_image(runtime: dict) -> str:
    """The image of a pool's ClusterTrainingRuntime (training_runtime's one container)."""
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return job["template"]["spec"]["template"]["spec"]["containers"][0]["image"]


def pool_of(pools: list[Pool], name: str) -> Pool:
    found = next((p for p in pools if p.name == name), None)
    if found is None:
        names = [p.name for p in pools]
        raise TaskError(
            f"no pool {name!r}; {did_you_mean(name, names)}allowed: {', '.join(names) or 'none'}"
        )
    return found
