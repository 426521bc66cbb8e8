"""The recorder's rules for when an admission or a node ends (usagerecorder/recorder.py), on
Workloads shaped as Kueue writes them; the whole recorder runs as the stack's CronJob in
devservers/tests/test_usage_report.py."""

from datetime import UTC, datetime, timedelta

from usagerecorder.recorder import JOB_MAP, job_records, merged, stamp

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
JOB_PODS = {"PyTorchJob": {"training.kubeflow.org/job-name": "{name}"}}
POOL_LABEL = "pool"


def at(hours_ago: float) -> str:
    return stamp(NOW - timedelta(hours=hours_ago))


def workload(admitted: str | None, status: str = "True", finished: str | None = None) -> dict:
    conditions = []
    if admitted:
        conditions.append({"type": "Admitted", "status": status, "lastTransitionTime": admitted})
    if finished:
        conditions.append({"type": "Finished", "status": "True", "lastTransitionTime": finished})
    owner = {"kind": "PyTorchJob", "name": "a", "controller": True}
    assignment = {"name": "worker", "flavors": {"nvidia.com/gpu": "gpu-small"},
                  "resourceUsage": {"nvidia.com/gpu": "4"}}  # fmt: skip
    return {
        "metadata": {"name": "pytorchjob-a", "uid": "u1", "ownerReferences": [owner]},
        "status": {
            "conditions": conditions,
            **({"admission": {"podSetAssignments": [assignment]}} if status == "True" else {}),
        },
    }


def seen(*workloads: dict, now: datetime = NOW) -> dict[str, dict]:
    return job_records(workloads, [], {}, JOB_PODS, POOL_LABEL, now)


def stored(records: dict[str, dict]) -> dict[str, tuple[str, dict]]:
    return {key: (f"{JOB_MAP}2026-11-30", record) for key, record in records.items()}


def test_an_admission_is_kept_under_its_start_and_rewritten_only_when_it_moves():
    running = workload(at(3))
    first = seen(running)
    ((key, record),) = first.items()
    assert key == f"u1.{int((NOW - timedelta(hours=3)).timestamp())}"
    assert (record["from"], record["to"], record["open"]) == (at(3), at(0), True)
    assert merged({}, first, {}, JOB_MAP) == {f"{JOB_MAP}2026-11-30": first}
    # Nothing new in the same second: nothing written; five minutes on: its end moves.
    assert merged(stored(first), first, {"u1": running}, JOB_MAP) == {}
    later = seen(running, now=NOW + timedelta(minutes=5))
    assert merged(stored(first), later, {"u1": running}, JOB_MAP) == {f"{JOB_MAP}2026-11-30": later}


def test_an_eviction_ends_the_admission_when_kueue_took_the_quota_back():
    first = seen(workload(at(3)))
    evicted = workload(at(0.5), status="False")
    writes = merged(stored(first), seen(evicted), {"u1": evicted}, JOB_MAP)
    ((record,),) = [list(w.values()) for w in writes.values()]
    assert (record["from"], record["to"], record["open"]) == (at(3), at(0.5), False)


def test_readmitted_between_runs_the_first_ends_at_the_run_that_last_saw_it():
    first = seen(workload(at(3)), now=NOW - timedelta(minutes=5))
    again = workload(at(0.02))  # evicted and admitted again since the last run
    writes = merged(stored(first), seen(again), {"u1": again}, JOB_MAP)
    records = sorted(writes[f"{JOB_MAP}2026-11-30"].values(), key=lambda r: r["from"])
    assert [(r["from"], r["to"], r["open"]) for r in records] == [
        (at(3), stamp(NOW - timedelta(minutes=5)), False),
        (at(0.02), at(0), True),
    ]


def test_a_finished_job_ends_at_its_finish_and_its_deletion_changes_nothing():
    done = seen(workload(at(3), finished=at(1)))
    ((record,),) = [list(done.values())]
    assert (record["to"], record["open"]) == (at(1), False)
    assert merged(stored(done), {}, {}, JOB_MAP) == {}  # deleted: closed already


def test_a_workload_that_never_held_quota_is_not_recorded():
    assert seen(workload(None)) == {} and seen(workload(at(1), status="False")) == {}
