"""`devctl status`: a team's jobs in its members' words, read as a member (the dev plan's
team Role) from the local Kubernetes API, where each job, its Kueue Workload and its pods are
left in a state as the operators, Kueue and the kubelet write it (devservers/job_status.py
names their sources; infra.kueue.tests.kueue_rules holds Kueue's condition types and reasons)."""

import io
import uuid

import pytest
import yaml

from devservers import cli
from devservers.job_status import KINDS, JobKind, describe, start_record
from infra.kueue.tests.kueue_rules import (
    ADMITTED,
    DEACTIVATED,
    EVICTED,
    PENDING,
    PODS_READY,
    PODS_READY_TIMEOUT,
    QUOTA_RESERVED,
    REQUEUING_LIMIT_EXCEEDED,
    WAIT_FOR_START,
    WAITING_FOR_QUOTA,
    WORKLOAD_VERSION,
    reason_with_cause,
)
from infra.operators.tests.job_crds import job_crds
from tests.kube_api import KubeAPI, rbac_of, user
from tests.kube_api.rbac import Authorizer

TEAM, OTHER = "team-a", "research"
# What Kueue's scheduler (KUEUE_CHART) writes on a workload that does not fit (flavorassigner.go).
NO_QUOTA = (
    "couldn't assign flavors to pod set worker: insufficient unused quota for nvidia.com/gpu in "
    "flavor gpu-small, 8 more needed"
)
START = (
    '{"event": "start", "world_size": %d, "resumed_from": %s, "unreadable": [], "step": 0, '
    '"config": {"checkpoint_dir": "/efs/checkpoints/%s"}}'
)
KIND = {k.kind: k for k in KINDS}


@pytest.fixture(scope="module")
def team_api(dev_plan):
    """An API whose authorizer holds the dev plan's RBAC, serving the job kinds, with the
    namespaces of two teams."""
    api = KubeAPI(Authorizer(rbac_of(dev_plan))).start()
    served = {(k.group, k.plural): k for k in api.kinds.values()}
    for crd in job_crds():
        api.call(api.create, served[("apiextensions.k8s.io", "customresourcedefinitions")], "", crd)
    for namespace in (TEAM, OTHER):
        api.call(api.create, served[("", "namespaces")], "", {"metadata": {"name": namespace}})
    api.settle()
    member = next(
        e.inputs
        for e in dev_plan.of_type("aws:eks/accessEntry:AccessEntry")
        if e.inputs.get("kubernetesGroups") == ["team:team-a"]
    )
    api.member = user(member["principalArn"], member["kubernetesGroups"])
    yield api
    api.stop()


def kind_of(api: KubeAPI, group: str, plural: str):
    return next(k for k in api.kinds.values() if (k.group, k.plural) == (group, plural))


def put(api: KubeAPI, group: str, plural: str, obj: dict) -> dict:
    """Create `obj` in TEAM, then give it its status as its controller would."""
    kind = kind_of(api, group, plural)
    status = obj.pop("status", None)
    created = api.call(api.create, kind, TEAM, obj)
    if status is not None:
        created = api.call(api.replace, kind, created, {**created, "status": status})
    return created


def condition(kind: str, status: bool, reason: str, message: str = "") -> dict:
    return {
        "type": kind,
        "status": str(status),
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-11-27T09:00:00Z",
    }


def job(api, kind: JobKind, name: str, queued: bool = True, conditions=()) -> dict:
    group, version = kind.api_version.split("/")
    labels = {"kueue.x-k8s.io/queue-name": TEAM} if queued else {}
    body = {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {"name": name, "labels": labels},
        "spec": {},
    }
    if kind.kind != "TrainJob":  # the upstream CRDs require their replica specs
        replicas = "pytorchReplicaSpecs" if kind.kind == "PyTorchJob" else "mpiReplicaSpecs"
        body["spec"][replicas] = {"Worker": {"template": {"spec": {"containers": []}}}}
    if conditions:
        body["status"] = {"conditions": list(conditions)}
    return put(api, group, f"{kind.kind.lower()}s", body)


def workload(api, owner: dict, counts: dict[str, int], conditions=(), **more) -> dict:
    """The Workload Kueue makes for `owner` (jobframework ConstructWorkload: owned by the job as
    its controller, labelled with its UID), in the state `conditions` say."""
    meta = owner["metadata"]
    body = {
        "apiVersion": f"kueue.x-k8s.io/{WORKLOAD_VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": f"{owner['kind'].lower()}-{meta['name']}-{uuid.uuid4().hex[:5]}",
            "labels": {"kueue.x-k8s.io/job-uid": meta["uid"]},
            "ownerReferences": [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "queueName": TEAM,
            "podSets": [{"name": n, "count": c} for n, c in counts.items()],
            **more.pop("spec", {}),
        },
        "status": {"conditions": list(conditions), **more},
    }
    return put(api, "kueue.x-k8s.io", "workloads", body)


def pod(api, name: str, labels: dict, ready: bool, log: str = "", scheduled: bool = True) -> None:
    """A pod as its operator labels it and its kubelet reports it; `log` what its container
    wrote."""
    run = f"containerd://{uuid.uuid4().hex}"
    conditions = [{"type": "PodScheduled", "status": str(scheduled)}]
    if not scheduled:
        conditions[0].update(reason="Unschedulable", message="0/3 nodes are available")
    conditions.append({"type": "Ready", "status": str(ready)})
    state = {"running": {}} if ready else {"waiting": {"reason": "ContainerCreating"}}
    put(
        api,
        "",
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "trainer@sha256:" + "a" * 64}]},
            "status": {
                "phase": "Running" if ready else "Pending",
                "conditions": conditions,
                "containerStatuses": [
                    {
                        "name": "main",
                        "containerID": run,
                        "ready": ready,
                        "restartCount": 0,
                        "state": state,
                        "image": "",
                        "imageID": "",
                        "started": ready,
                    }
                ],
            },
        },
    )
    api.container_logs[run] = log


def status(api, tmp_path, monkeypatch, *argv: str) -> tuple[int, str]:
    """`devctl status` as the team member runs it, with her kubeconfig: exit code, output."""
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump(api.kubeconfig(api.add_token(api.member))))
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the client's discovery cache
    out = io.StringIO()
    code = cli.main(["status", *argv], out=out)
    return code, out.getvalue()


def test_status_says_where_each_job_of_the_team_is(team_api, tmp_path, monkeypatch, capsys):
    api = team_api
    pytorch, mpi, train = KIND["PyTorchJob"], KIND["MPIJob"], KIND["TrainJob"]
    torch_pods = {"training.kubeflow.org/operator-name": "pytorchjob-controller"}

    # Queued: the scheduler found no room (QuotaReserved False, WaitingForQuota with the
    # UnadmittedWorkloadsObservability gate on, Kueue 0.20's default).
    queued = job(api, pytorch, "big")
    no_room = condition(QUOTA_RESERVED, False, WAITING_FOR_QUOTA, NO_QUOTA)
    workload(api, queued, {"worker": 4}, [no_room])

    # Running, restarted: rank 0's pod (PyTorchJob's master) logged two starts, the newest
    # resumed from step 100.
    running = job(api, pytorch, "small")
    workload(
        api,
        running,
        {"worker": 2},
        [
            condition(QUOTA_RESERVED, True, "QuotaReserved"),
            condition(ADMITTED, True, "Admitted"),
            condition(PODS_READY, True, "Started"),
        ],
    )
    labels = {**torch_pods, "training.kubeflow.org/job-name": "small"}
    pod(api, "small-worker-1", labels, ready=True, log="no start line here\n")
    log = "\n".join(
        [START % (2, "null", "small"), '{"step": 10}', START % (1, "100", "small"), '{"step": 110}']
    )
    pod(
        api,
        "small-worker-0",
        {**labels, "training.kubeflow.org/job-role": "master"},
        ready=True,
        log=log,
    )

    # Admitted, starting: an MPIJob whose second worker waits for a node.
    starting = job(api, mpi, "mpi")
    workload(
        api,
        starting,
        {"launcher": 1, "worker": 2},
        [
            condition(QUOTA_RESERVED, True, "QuotaReserved"),
            condition(ADMITTED, True, "Admitted"),
            condition(PODS_READY, False, WAIT_FOR_START, "Not all pods are ready or succeeded"),
        ],
    )
    mpi_labels = {
        "training.kubeflow.org/job-name": "mpi",
        "training.kubeflow.org/operator-name": "mpi-operator",
    }
    pod(api, "mpi-worker-0", {**mpi_labels, "training.kubeflow.org/job-role": "worker"}, True)
    pod(
        api,
        "mpi-worker-1",
        {**mpi_labels, "training.kubeflow.org/job-role": "worker"},
        False,
        scheduled=False,
    )

    # Evicted by waitForPodsReady, waiting out its backoff.
    evicted = job(api, train, "tj")
    message = "Exceeded the PodsReady timeout team-a/trainjob-tj"
    workload(
        api,
        evicted,
        {"node": 2},
        [
            condition(EVICTED, True, PODS_READY_TIMEOUT, message),
            condition(QUOTA_RESERVED, False, PENDING, "The workload was evicted"),
        ],
        requeueState={"count": 1, "requeueAt": "2026-11-27T10:00:00Z"},
    )

    # Deactivated for good after its requeues ran out.
    stopped = job(api, mpi, "gone")
    workload(
        api,
        stopped,
        {"launcher": 1, "worker": 2},
        [
            condition(
                EVICTED,
                True,
                reason_with_cause(DEACTIVATED, REQUEUING_LIMIT_EXCEEDED),
                "The workload is deactivated due to exceeding the maximum number of "
                "re-queuing retries",
            )
        ],
        spec={"active": False},
    )

    # Finished, as the operators say it: PyTorchJob Succeeded, TrainJob Failed.
    job(
        api,
        pytorch,
        "done",
        conditions=[
            condition(
                "Succeeded",
                True,
                "PyTorchJobSucceeded",
                "PyTorchJob done is successfully completed.",
            )
        ],
    )
    job(
        api,
        train,
        "broken",
        conditions=[
            condition(
                "Failed", True, "DeadlineExceeded", "TrainJob exceeded its activeDeadlineSeconds"
            )
        ],
    )

    # Kueue has not seen it yet; and one without the queue label, which Kueue never admits.
    job(api, train, "new")
    job(api, pytorch, "rogue", queued=False)

    code, out = status(api, tmp_path, monkeypatch, "-n", TEAM)
    assert code == 0, capsys.readouterr().err
    assert out.splitlines() == [
        "JOB     KIND        STATE       PODS  DETAIL",
        f"big     PyTorchJob  queued      0/4   {WAITING_FOR_QUOTA}: {NO_QUOTA}",
        "broken  TrainJob    failed      0/0   TrainJob exceeded its activeDeadlineSeconds",
        "done    PyTorchJob  succeeded   0/0   PyTorchJob done is successfully completed.",
        "gone    MPIJob      stopped     0/3   deactivated by Kueue, it will not be admitted "
        "again; DeactivatedDueToRequeuingLimitExceeded: The workload is deactivated due to "
        "exceeding the maximum number of re-queuing retries",
        "mpi     MPIJob      admitted    1/3   starting: 1 of 3 pods ready; 1 pod waiting for a "
        "node",
        "new     TrainJob    queued      0/0   Kueue has not made its Workload yet",
        "rogue   PyTorchJob  not queued  0/0   no kueue.x-k8s.io/queue-name label: Kueue does not "
        "admit it, it is outside the team's quota",
        "small   PyTorchJob  running     2/2   2 of 2 pods ready; resumed from the checkpoint of "
        "step 100 in /efs/checkpoints/small",
        f"tj      TrainJob    evicted     0/2   {PODS_READY_TIMEOUT}: {message}; requeued at "
        "2026-11-27T10:00:00Z (requeue 1)",
    ]
    assert api.refusals == []

    code, out = status(api, tmp_path, monkeypatch, "-n", TEAM, "small")
    assert code == 0 and len(out.splitlines()) == 2 and out.splitlines()[1].startswith("small ")


def test_status_in_another_teams_namespace_is_refused_in_one_line(
    team_api, tmp_path, monkeypatch, capsys
):
    code, out = status(team_api, tmp_path, monkeypatch, "-n", OTHER)
    err = capsys.readouterr().err
    assert code == 1 and out == ""
    assert err.startswith(f"devctl: not allowed to read jobs in namespace {OTHER} (")
    assert err.endswith(
        "your role must be among your team's members (queues.teams[].members of the stack)\n"
    )
    assert len(err.splitlines()) == 1
    team_api.refusals.clear()


def test_the_newest_start_line_wins_and_a_fresh_start_is_named():
    log = "\n".join([START % (2, "null", "j"), "noise {", START % (2, "40", "j")])
    assert start_record(log)["resumed_from"] == 40
    fresh = {"metadata": {"name": "j", "labels": {}}}
    wl = {
        "spec": {"podSets": [{"count": 1}]},
        "status": {
            "conditions": [
                condition(ADMITTED, True, "Admitted"),
                condition(PODS_READY, True, "Started"),
            ]
        },
    }
    said = describe(KIND["PyTorchJob"], fresh, wl, [], start_record(START % (1, "null", "j")))
    assert said.detail == "0 of 1 pods ready; started from scratch (no checkpoint)"


def test_the_job_kinds_are_the_ones_the_platform_renders():
    from workloads.manifests import API_VERSIONS

    jobs = {kind: v for kind, v in API_VERSIONS.items() if not kind.endswith("TrainingRuntime")}
    assert set(jobs) == set(KIND)
    for kind, version in jobs.items():
        assert KIND[kind].api_version == version
