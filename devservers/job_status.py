"""`devctl status`: a team's training jobs in its members' words, PyTorchJob, MPIJob and
TrainJob alike: queued (and Kueue's reason), admitted and starting, running (pods ready of all,
and the checkpoint the trainer resumed from), evicted and waiting to be requeued, finished.

It reads the jobs, their Kueue Workloads and their pods in one namespace, and, for a job whose
pods run, the trainer's JSON `start` line (trainer/train.py: `resumed_from`, the step of the
checkpoint it loaded, or null) from the log of the pod that runs rank 0. What each operator
and Kueue write is named below from their sources:

- Kueue v0.20.7 (read at v0.19.2, kubernetes-sigs/kueue commit
  8eab68778fc1b52affe165fdf5af29d1e9b4f3cb, and at main ff69552e, the newest readable commit of
  the 0.20 line): a job's Workload has the job as its controller owner
  (pkg/controller/jobframework/reconciler.go, ConstructWorkload). Its conditions
  (apis/kueue/v1beta2/workload_types.go): QuotaReserved (False while queued: the scheduler's
  reason, such as `WaitingForQuota` with the UnadmittedWorkloadsObservability gate on, its 0.20
  default, and its message, such as "couldn't assign flavors to pod set
  worker: insufficient unused quota for nvidia.com/gpu in flavor gpu-small, 8 more needed",
  pkg/scheduler/scheduler.go and flavorassigner/flavorassigner.go), Admitted, PodsReady (False
  with WaitForStart before the pods are ready, WaitForRecovery after one failed), Evicted (True
  until quota is reserved again, which sets it False: pkg/workload/workload.go
  SetQuotaReservation; reasons Preempted, PodsReadyTimeout, Deactivated, ...), Finished
  (Succeeded or Failed). `spec.active: false` is a workload Kueue deactivated for good, e.g.
  after waitForPodsReady's requeues ran out; `status.requeueState` holds the next requeue.
- Kubeflow training operator v1.9.4 (kubeflow/trainer): PyTorchJob conditions Created, Running,
  Restarting, Succeeded, Suspended, Failed (pkg/apis/kubeflow.org/v1/common_types.go); pods
  labelled training.kubeflow.org/job-name and operator-name pytorchjob-controller
  (pkg/controller.v1/common/job_controller.go GenLabels), rank 0's pod job-role=master: the
  Master, else Worker 0 (pkg/controller.v1/pytorch/pytorchjob_controller.go IsMasterRole).
- MPI operator v0.8.0 (kubeflow/mpi-operator): the same condition types
  (pkg/apis/kubeflow/v2beta1/types.go); pods labelled job-name, operator-name mpi-operator and
  job-role launcher or worker (pkg/controller/mpi_job_controller.go defaultLabels); mpirun in the
  launcher prints every rank's output.
- Kubeflow Trainer v2.3.0 (kubeflow/trainer): TrainJob conditions Suspended, Complete, Failed
  (pkg/apis/trainer/v1alpha1/trainjob_types.go); its JobSet carries its name
  (pkg/runtime/framework/plugins/jobset/jobset.go), whose pods are labelled
  jobset.sigs.k8s.io/jobset-name, replicatedjob-name (`node`, or `launcher` for MPI:
  pkg/constants/constants.go) and job-index (kubernetes-sigs/jobset api/jobset/v1alpha2), and by
  the Job controller batch.kubernetes.io/job-completion-index.
"""

import json
from dataclasses import dataclass

from devservers.api import controller_ref
from devservers.kube import NotServed

WORKLOAD_API = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_NAME = "training.kubeflow.org/job-name"
OPERATOR = "training.kubeflow.org/operator-name"
JOB_ROLE = "training.kubeflow.org/job-role"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"


@dataclass(frozen=True)
class JobKind:
    kind: str
    api_version: str
    succeeded: str  # the condition type of a job that succeeded

    def pod_labels(self, name: str) -> dict[str, str]:
        """The labels its operator puts on every pod of job `name`."""
        if self.kind == "TrainJob":
            return {JOBSET_NAME: name}
        operator = "pytorchjob-controller" if self.kind == "PyTorchJob" else "mpi-operator"
        return {JOB_NAME: name, OPERATOR: operator}

    def rank_zero_first(self, pod: dict) -> int:
        """Sort key: the pod that prints rank 0's lines first (PyTorchJob's master, the MPI
        launcher, a TrainJob's launcher or first node), then the others."""
        labels = pod["metadata"].get("labels") or {}
        if self.kind == "TrainJob":
            first = labels.get(JOB_INDEX, "0") == "0" and labels.get(COMPLETION_INDEX, "0") == "0"
            return {"launcher": 0, "node": 1}.get(labels.get(REPLICATED_JOB), 2) * 2 + (not first)
        return 0 if labels.get(JOB_ROLE) in ("master", "launcher") else 1


KINDS = [
    JobKind("PyTorchJob", "kubeflow.org/v1", "Succeeded"),
    JobKind("MPIJob", "kubeflow.org/v2beta1", "Succeeded"),
    JobKind("TrainJob", "trainer.kubeflow.org/v1alpha1", "Complete"),
]


@dataclass(frozen=True)
class JobStatus:
    name: str
    kind: str
    state: str
    pods: str  # ready (or done) of all, e.g. 2/4
    detail: str


def condition(obj: dict | None, kind: str) -> dict | None:
    for found in ((obj or {}).get("status") or {}).get("conditions") or []:
        if found.get("type") == kind:
            return found
    return None


def is_true(obj: dict | None, kind: str) -> bool:
    return (condition(obj, kind) or {}).get("status") == "True"


def _said(found: dict) -> str:
    """A condition in words: its message, else its reason."""
    return found.get("message") or found.get("reason") or ""


def owned_by(workload: dict, job: dict) -> bool:
    owner = controller_ref(workload)
    return owner is not None and owner.get("uid") == job["metadata"].get("uid")


def labelled(objects: list[dict], wanted: dict[str, str]) -> list[dict]:
    """Those of `objects` that carry every label of `wanted`."""
    return [
        o
        for o in objects
        if all((o["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())
    ]


def pod_done(pod: dict) -> bool:
    """Kueue's PodsReady counts pods that are ready or have succeeded."""
    status = pod.get("status") or {}
    if status.get("phase") == "Succeeded":
        return True
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def plural(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def waiting_for_nodes(pods: list[dict]) -> int:
    return sum(
        1
        for p in pods
        if any(
            c.get("type") == "PodScheduled" and c.get("status") == "False"
            for c in (p.get("status") or {}).get("conditions") or []
        )
    )


def start_record(log: str) -> dict | None:
    """The newest JSON `start` line of the trainer in a log (each start of the trainer in that
    container prints one: a torchrun restart, a resumed run)."""
    found = None
    for line in log.splitlines():
        line = line.strip()
        if not line.startswith("{") or '"start"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "start":
            found = record
    return found


def resumed(record: dict | None) -> str:
    if record is None:
        return ""
    step, where = record.get("resumed_from"), (record.get("config") or {}).get("checkpoint_dir")
    if step is None:
        said = "started from scratch (no checkpoint)"
    else:
        said = f"resumed from the checkpoint of step {step}" + (f" in {where}" if where else "")
    if record.get("unreadable"):
        said += f"; set aside unreadable: {', '.join(record['unreadable'])}"
    return said


def describe(kind: JobKind, job: dict, workload: dict | None, pods: list[dict],
             start: dict | None = None) -> JobStatus:  # fmt: skip
    """Where the job is, from the job, its Workload (None: Kueue made none) and its pods."""
    name = job["metadata"]["name"]
    counts = [s.get("count", 1) for s in ((workload or {}).get("spec") or {}).get("podSets") or []]
    total = sum(counts) if counts else len(pods)
    done = sum(1 for p in pods if pod_done(p) and not p["metadata"].get("deletionTimestamp"))

    def status(state: str, *details: str) -> JobStatus:
        detail = "; ".join(d for d in details if d)
        return JobStatus(name, kind.kind, state, f"{done}/{total}", detail)

    for finished, state in ((kind.succeeded, "succeeded"), ("Failed", "failed")):
        if is_true(job, finished):
            return status(state, _said(condition(job, finished)))
    if is_true(workload, "Finished"):
        found = condition(workload, "Finished")
        state = "succeeded" if found.get("reason") == "Succeeded" else "failed"
        return status(state, _said(found))
    if workload is None:
        if QUEUE_LABEL not in (job["metadata"].get("labels") or {}):
            return status(
                "not queued",
                f"no {QUEUE_LABEL} label: Kueue does not admit it, it is outside the team's quota",
            )
        return status("queued", "Kueue has not made its Workload yet")
    waiting = waiting_for_nodes(pods)
    nodes = f"{plural(waiting, 'pod')} waiting for a node" if waiting else ""
    if (workload.get("spec") or {}).get("active") is False:
        evicted = condition(workload, "Evicted") or {}
        return status(
            "stopped",
            "deactivated by Kueue, it will not be admitted again",
            f"{evicted.get('reason')}: {_said(evicted)}" if evicted else "",
        )
    if is_true(workload, "Evicted"):
        evicted = condition(workload, "Evicted")
        requeue = (workload.get("status") or {}).get("requeueState") or {}
        again = (
            f"requeued at {requeue['requeueAt']} (requeue {requeue.get('count', 1)})"
            if requeue.get("requeueAt")
            else "back in the queue"
        )
        return status("evicted", f"{evicted.get('reason')}: {_said(evicted)}", again)
    if is_true(workload, "Admitted"):
        ready = condition(workload, "PodsReady")
        if ready is not None and ready.get("status") == "True":
            restarts = sum(
                s.get("restartCount", 0)
                for p in pods
                for s in (p.get("status") or {}).get("containerStatuses") or []
            )
            return status(
                "running",
                f"{done} of {total} pods ready",
                f"{plural(restarts, 'container restart')}" if restarts else "",
                resumed(start),
            )
        recovering = (ready or {}).get("reason") == "WaitForRecovery"
        return status(
            "admitted",
            f"{'recovering after a pod failed' if recovering else 'starting'}: "
            f"{done} of {total} pods ready",
            nodes,
            resumed(start),
        )
    reserved = condition(workload, "QuotaReserved")
    if reserved is not None and reserved.get("status") == "True":
        checks = _said(condition(workload, "Admitted") or {})
        return status("queued", "quota reserved, waiting for admission checks", checks)
    if reserved is not None:
        return status("queued", f"{reserved.get('reason')}: {_said(reserved)}")
    return status("queued", "waiting for Kueue to consider it")


def table(rows: list[JobStatus]) -> list[str]:
    cells = [["JOB", "KIND", "STATE", "PODS", "DETAIL"]] + [
        [r.name, r.kind, r.state, r.pods, r.detail] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(4)]
    return [
        (
            "  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
        ).rstrip()
        for row in cells
    ]


def collect(cluster, namespace: str, name: str | None = None) -> list[JobStatus]:
    """The status of every job in `namespace` (or those named `name`), from `cluster`
    (devservers.kube.KubeCluster: list, and log of a pod's container)."""
    jobs = []
    for kind in KINDS:
        try:
            found = cluster.list(kind.api_version, kind.kind, namespace, {})
        except NotServed:
            continue
        jobs += [(kind, j) for j in found if name is None or j["metadata"]["name"] == name]
    if not jobs:
        return []
    workloads = cluster.list(WORKLOAD_API, "Workload", namespace, {})
    pods = cluster.list("v1", "Pod", namespace, {})
    statuses = []
    for kind, job in sorted(jobs, key=lambda kj: kj[1]["metadata"]["name"]):
        owned = next((w for w in workloads if owned_by(w, job)), None)
        mine = labelled(pods, kind.pod_labels(job["metadata"]["name"]))
        status = describe(kind, job, owned, mine)
        if status.state in ("running", "admitted"):
            status = describe(kind, job, owned, mine, _newest_start(cluster, kind, mine))
        statuses.append(status)
    return statuses


def log_container(pod: dict) -> str:
    """The container whose log a pod's output is: the default one it names, else its first."""
    named = (pod["metadata"].get("annotations") or {}).get(DEFAULT_CONTAINER)
    return named or pod["spec"]["containers"][0]["name"]


def _newest_start(cluster, kind: JobKind, pods: list[dict]) -> dict | None:
    """The trainer's newest start record, from the pod that prints rank 0's lines first."""
    for pod in sorted(pods, key=kind.rank_zero_first):
        if (pod.get("status") or {}).get("phase") not in ("Running", "Succeeded", "Failed"):
            continue
        meta = pod["metadata"]
        try:
            record = start_record(cluster.log(meta["namespace"], meta["name"], log_container(pod)))
        except OSError:
            continue  # not started yet, gone meanwhile: the next pod may say
        if record is not None:
            return record
    return None
