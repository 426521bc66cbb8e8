"""`devctl logs` and `devctl fetch`: what a team's job printed, and the files it made, with the
member's own rights (read pods and their logs; create a pod and exec into it).

    devctl logs cnn [--node 1] [-f]        (a node's pod: its torchrun and every rank on it)
    devctl fetch cnn [outputs] [--out DIR] (a path of the job's folder, copied here)

The job's folder is the one its pods write (trainer.user_code's --checkpoint-dir, the trainer's
--checkpoint-dir, else the job's CHECKPOINT_DIR): on the team's file system it is read through a
short-lived pod mounting the team's claim read-only, in S3 through one with the team's identity
(trainer.cluster_copy), deleted after.
"""

import sys
from pathlib import Path

from devservers.devctl import CliError, Devctl
from devservers.job_status import (
    COMPLETION_INDEX,
    JOB_ROLE,
    KINDS,
    QUEUE_LABEL,
    REPLICATED_JOB,
    JobKind,
    log_container,
)
from devservers.kube import NotServed

# The pod label that numbers a PyTorchJob's workers (kubeflow/trainer release-1.9
# pkg/controller.v1/common/pod.go: training.kubeflow.org/replica-index).
REPLICA_INDEX = "training.kubeflow.org/replica-index"
CHECKPOINT_OPTION = "--checkpoint-dir"
CHECKPOINT_ENV = "CHECKPOINT_DIR"
START_SECONDS = 300  # how long the copy pod may wait for its queue and a node


def find_job(devctl: Devctl, name: str) -> tuple[JobKind, dict]:
    for kind in KINDS:
        try:
            with devctl.allowed(f"read {kind.kind}s", team=True):
                found = devctl.cluster.get(kind.api_version, kind.kind, name, devctl.namespace)
        except NotServed:  # a cluster without that operator has no such job
            continue
        if found is not None:
            return kind, found
    raise CliError(f"no job {name!r} in {devctl.namespace}; `devctl status` lists them")


def launcher(pod: dict) -> bool:
    """An MPI launcher (MPIJob, or a TrainJob's), which runs no rank."""
    labels = pod["metadata"].get("labels") or {}
    return "launcher" in (labels.get(JOB_ROLE), labels.get(REPLICATED_JOB))


def node_index(pod: dict) -> int:
    labels = pod["metadata"].get("labels") or {}
    return int(labels.get(COMPLETION_INDEX) or labels.get(REPLICA_INDEX) or 0)


def logs(devctl: Devctl, name: str, node: int, follow: bool) -> int:
    kind, _ = find_job(devctl, name)
    with devctl.allowed("list pods", team=True):
        pods = devctl.cluster.list("v1", "Pod", devctl.namespace, kind.pod_labels(name))
    ranks = sorted((p for p in pods if not launcher(p)), key=node_index)
    found = next((p for p in ranks if node_index(p) == node), None)
    if found is None:
        have = ", ".join(str(node_index(p)) for p in ranks) or "none yet"
        raise CliError(f"job {name} has no pod of node {node} (nodes with pods: {have})")
    pod, container = found["metadata"]["name"], log_container(found)
    with devctl.allowed("read pod logs", team=True):
        for chunk in devctl.cluster.log_stream(devctl.namespace, pod, container, follow):
            devctl.out.write(chunk.decode(errors="replace"))
            devctl.out.flush()
    return 0


def _pod_spec(kind: JobKind, job: dict) -> tuple[dict, list[str], list[dict]]:
    """(the job's training container, its command and arguments, its environment)."""
    spec = job["spec"]
    if kind.kind == "TrainJob":
        trainer = spec.get("trainer") or {}
        return (
            trainer,
            [*(trainer.get("command") or []), *(trainer.get("args") or [])],
            (trainer.get("env") or []),
        )
    replicas = spec.get("pytorchReplicaSpecs") or spec.get("mpiReplicaSpecs") or {}
    template = (replicas.get("Worker") or replicas.get("Launcher") or {}).get("template", {})
    container = (template.get("spec", {}).get("containers") or [{}])[0]
    command = [*(container.get("command") or []), *(container.get("args") or [])]
    return container, command, container.get("env") or []


def job_folder(kind: JobKind, job: dict) -> tuple[str, str]:
    """(the job's folder, the image its pods run)."""
    container, command, env = _pod_spec(kind, job)
    folder = None
    if CHECKPOINT_OPTION in command[:-1]:
        folder = command[command.index(CHECKPOINT_OPTION) + 1]
    folder = folder if folder and "$(" not in folder else None
    folder = folder or next((e.get("value") for e in env if e["name"] == CHECKPOINT_ENV), None)
    if not folder:
        raise CliError(
            f"job {job['metadata']['name']} names no folder ({CHECKPOINT_OPTION} or "
            f"{CHECKPOINT_ENV}): nothing to fetch"
        )
    return folder, container.get("image", "")


def fetch(devctl: Devctl, name: str, path: str, out: Path | None, queue: str) -> int:
    from trainer.cluster_copy import PodFolder

    kind, job = find_job(devctl, name)
    folder, image = job_folder(kind, job)
    relative = path.strip("/")
    if not relative or ".." in relative.split("/"):
        raise CliError(f"{path!r}: allowed: a path inside the job's folder {folder}, e.g. outputs")
    destination = (out or Path(name)).resolve()
    destination.mkdir(parents=True, exist_ok=True)
    queue = queue or (job["metadata"].get("labels") or {}).get(QUEUE_LABEL, "")
    with PodFolder(devctl.namespace, folder, image, queue, START_SECONDS) as pod:
        pod.copy_path(relative, destination)
    print(f"devctl: {folder}/{relative} -> {destination / relative}", file=sys.stderr)
    return 0
