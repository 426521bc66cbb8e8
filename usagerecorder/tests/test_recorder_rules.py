"""The recorder's rules (usagerecorder/recorder.py, records.py): when an admission or a node ends,
what a record keeps, where it goes and when its map is deleted, on Workloads shaped as Kueue writes
them; the whole recorder runs as the stack's CronJob in devservers/tests/test_usage_report.py."""

import json
from datetime import UTC, datetime, timedelta

from usagerecorder.recorder import expired, job_records, merged, placed
from usagerecorder.records import JOB_MAP, MAX_MAP_BYTES, entries, job_pods, stamp

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
JOB_LABEL = "training.kubeflow.org/job-name"
POD_LABELS = {"PyTorchJob": {JOB_LABEL: "{name}"}}
POOL_LABEL = "pool"
DAY = f"{JOB_MAP}2026-11-30"


def at(hours_ago: float) -> str:
    return stamp(NOW - timedelta(hours=hours_ago))


def workload(admitted: str | None, status: str = "True", finished: str | None = None) -> dict:
    conditions = []
    if admitted:
        conditions.append({"type": "Admitted", "status": status, "lastTransitionTime": admitted})
    if finished:
        conditions.append({"type": "Finished", "status": "True", "lastTransitionTime": finished})
    owner = {"kind": "PyTorchJob", "name": "a", "uid": "j1", "controller": True}
    assignment = {"name": "worker", "flavors": {"nvidia.com/gpu": "gpu-small"},
                  "resourceUsage": {"nvidia.com/gpu": "4"}}  # fmt: skip
    return {
        "metadata": {"name": "pytorchjob-a", "uid": "u1", "ownerReferences": [owner]},
        "status": {
            "conditions": conditions,
            **({"admission": {"podSetAssignments": [assignment]}} if status == "True" else {}),
        },
    }


def pod(name: str, node: str, owned: bool = True) -> dict:
    owners = [{"kind": "PyTorchJob", "name": "a", "uid": "j1", "controller": True}]
    meta = {"name": name, "labels": {JOB_LABEL: "a"}}
    if owned:
        meta["ownerReferences"] = owners
    return {"metadata": meta, "spec": {"nodeName": node}}


def node(name: str, instance: str, capacity: str) -> dict:
    labels = {POOL_LABEL: "gpu-small", "node.kubernetes.io/instance-type": instance,
              "karpenter.sh/capacity-type": capacity}  # fmt: skip
    return {"metadata": {"name": name, "labels": labels}}


def seen(*workloads: dict, now: datetime = NOW, pods=(), nodes=None) -> dict[str, dict]:
    return job_records(workloads, list(pods), nodes or {}, POD_LABELS, POOL_LABEL, now)


def stored(records: dict[str, dict], where: str = DAY) -> dict[str, tuple[str, dict]]:
    return {key: (where, record) for key, record in records.items()}


def test_an_admission_is_kept_under_its_start_and_rewritten_only_when_it_moves():
    running = workload(at(3))
    first = seen(running)
    ((key, record),) = first.items()
    assert key == f"u1.{int((NOW - timedelta(hours=3)).timestamp())}"
    assert (record["from"], record["to"], record["open"]) == (at(3), at(0), True)
    assert merged({}, first, {}) == ({}, first)
    # Nothing new in the same second: nothing written; five minutes on: its end moves.
    assert merged(stored(first), first, {"u1": running}) == ({}, {})
    later = seen(running, now=NOW + timedelta(minutes=5))
    assert merged(stored(first), later, {"u1": running}) == ({DAY: later}, {})


def test_an_eviction_ends_the_admission_when_kueue_took_the_quota_back():
    first = seen(workload(at(3)))
    evicted = workload(at(0.5), status="False")
    updates, new = merged(stored(first), seen(evicted), {"u1": evicted})
    ((record,),) = [list(w.values()) for w in updates.values()]
    assert (record["from"], record["to"], record["open"]) == (at(3), at(0.5), False) and not new


def test_readmitted_between_runs_the_first_ends_at_the_run_that_last_saw_it():
    first = seen(workload(at(3)), now=NOW - timedelta(minutes=5))
    again = workload(at(0.02))  # evicted and admitted again since the last run
    updates, new = merged(stored(first), seen(again), {"u1": again})
    (closed,) = updates[DAY].values()
    assert (closed["from"], closed["to"], closed["open"]) == (at(3), at(5 / 60), False)
    ((opened),) = new.values()
    assert (opened["from"], opened["to"], opened["open"]) == (at(0.02), at(0), True)


def test_a_finished_job_ends_at_its_finish_and_its_deletion_changes_nothing():
    done = seen(workload(at(3), finished=at(1)))
    (record,) = done.values()
    assert (record["to"], record["open"]) == (at(1), False)
    assert merged(stored(done), {}, {}) == ({}, {})  # deleted: closed already


def test_a_workload_that_never_held_quota_is_not_recorded():
    assert seen(workload(None)) == {} and seen(workload(at(1), status="False")) == {}


def test_the_nodes_a_job_ran_on_outlive_its_pods_and_a_pod_of_no_controller_is_not_its():
    running = workload(at(3))
    nodes = {"n1": node("n1", "g5.12xlarge", "spot"), "n2": node("n2", "g5.2xlarge", "on-demand")}
    # A member's pod carrying the job's labels on a cheaper node: no owner, not the job's.
    pods = [pod("a-worker-0", "n1"), pod("decoy", "n2", owned=False)]
    assert [p["metadata"]["name"] for p in job_pods(running, pods, POD_LABELS)] == ["a-worker-0"]
    first = seen(running, pods=pods, nodes=nodes)
    (pod_set,) = next(iter(first.values()))["podSets"]
    assert (pod_set["instanceTypes"], pod_set["capacities"]) == (["g5.12xlarge"], ["spot"])
    # Drained at an eviction while still admitted: the record keeps what it ran on.
    later = seen(running, now=NOW + timedelta(minutes=5), nodes=nodes)
    updates, _ = merged(stored(first), later, {"u1": running})
    (kept,) = updates[DAY].values()
    assert kept["podSets"][0]["capacities"] == ["spot"] and kept["to"] == at(-5 / 60)


def test_a_full_days_map_goes_on_in_the_next_and_a_map_goes_once_all_it_holds_ended_long_ago():
    big = {"x": "y" * (MAX_MAP_BYTES - 100)}
    maps = [{"metadata": {"name": DAY}, "data": big}]
    new = seen(workload(at(3)))
    assert set(placed(maps, new, JOB_MAP)) == {f"{DAY}-1"}
    assert set(placed([], new, JOB_MAP)) == {DAY}
    running = {**next(iter(new.values())), "from": at(2000)}
    old_open = {"metadata": {"name": f"{JOB_MAP}2026-09-01"}, "data": {"k": json.dumps(running)}}
    closed = {**running, "to": at(1900), "open": False}
    old_closed = {"metadata": {"name": f"{JOB_MAP}2026-09-02"}, "data": {"k": json.dumps(closed)}}
    recent = {**closed, "to": at(1)}
    ran_long = {"metadata": {"name": f"{JOB_MAP}2026-09-03"}, "data": {"k": json.dumps(recent)}}
    by_hand = {"metadata": {"name": f"{JOB_MAP}2026-09-04"}, "data": {"k": "not json"}}
    oldest = NOW - timedelta(days=35)
    # Still running, or ended within the kept days: kept however old the day it began.
    assert expired([old_open, old_closed, ran_long, by_hand], oldest) == [
        f"{JOB_MAP}2026-09-02",
        f"{JOB_MAP}2026-09-04",
    ]


def test_a_record_edited_out_of_shape_is_skipped_not_a_crash():
    good = next(iter(seen(workload(at(3))).values()))
    maps = [{"metadata": {"name": DAY}, "data": {
        "a": json.dumps(good), "b": "[]", "c": json.dumps({**good, "podSets": None} | {"to": "x"}),
        "d": json.dumps({k: v for k, v in good.items() if k != "from"})}}]  # fmt: skip
    assert [key for _, key, _ in entries(maps)] == ["a"]
