"""Idle stops report their savings: a week of two servers run by the operator's reconcile
(devservers.operator._refresh) on the local Kubernetes API, on the test's clock, with pods bound
to nodes of the dev stack's instance types (as the scheduler binds them); then `devctl savings`
against a count by hand, and the Events and metrics each idle stop and restart left."""

import io
import json
import re
from datetime import timedelta

import pytest
from kubernetes.dynamic.exceptions import ForbiddenError
from prometheus_client import generate_latest

from devservers import cli, operator
from devservers.api import API_VERSION, timestamp
from devservers.savings import (
    IDLE_STOPPED,
    LEDGER_PREFIX,
    MAX_DELETED,
    RUNNING,
    STOPPED,
    Totals,
    expired,
    ledger_copy,
    record,
    report,
    with_deleted,
)
from devservers.tests.test_devservers_operator import START, World, gpu_at
from devservers.tests.test_devservers_render import server as server_manifest

# The nodes the pods land on: (instance type, capacity). g5.12xlarge: 4 GPUs, 48 vCPU, 192 GiB;
# m6i.2xlarge: 8 vCPU, 32 GiB (infra/core/catalog/instance_types.yaml).
NODES = {
    "dev-alice": (
        "gpu-node",
        "g5.12xlarge",
        {"nvidia.com/gpu": "4", "cpu": "48", "memory": "192Gi"},
    ),
    "dev-bob": ("cpu-node", "m6i.2xlarge", {"cpu": "8", "memory": "32Gi"}),
}


@pytest.fixture
def week(dev_cluster, monkeypatch):
    world = World(dev_cluster, monkeypatch)
    admin = dev_cluster.client()
    for name, kind, capacity in NODES.values():
        admin.resources.get(api_version="v1", kind="Node").create(
            body={
                "metadata": {"name": name, "labels": {"node.kubernetes.io/instance-type": kind}},
                "status": {"capacity": capacity},
            }
        )

    def bind(kind, obj):  # the scheduler: each namespace's pods on its node
        if kind.kind == "Pod" and obj["metadata"]["namespace"] in NODES:
            obj["spec"]["nodeName"] = NODES[obj["metadata"]["namespace"]][0]

    world.api.admission.append(bind)
    return world


def run_the_week(world: World, monkeypatch) -> None:
    """alice's gpu-1 server `box` (idleTimeout 30m) works 09:00 to 16:30 on five days and stops
    for idleness at 17:00 each (warned at 16:50); she starts it again at 09:00 the next four.
    bob's cpu-small server `lab`, autoShutdown off, was created a day before the week and runs
    through it."""
    servers = world.dev_cluster.client().resources.get(api_version=API_VERSION, kind="DevServer")
    lab = server_manifest(owner="bob", flavor="cpu-small", lifecycle={"autoShutdown": False})
    lab["metadata"] = {"name": "lab", "namespace": "dev-bob"}
    world.clock = START - timedelta(days=1)
    servers.create(body=lab, namespace="dev-bob")
    world.refresh("lab", namespace="dev-bob")
    world.refresh("lab", namespace="dev-bob")
    world.clock = START
    world.create(lifecycle={"idleTimeout": "30m"})
    for day in range(5):
        morning = START + timedelta(days=day)
        if day:
            world.clock = morning
            world.patch("DevServer", "box", {"spec": {"stopped": False}})  # devctl start
            world.refresh()
            world.refresh()
        assert world.status()["phase"] == "Running"
        for minutes, gpu in ((7 * 60 + 30, 87.0), (7 * 60 + 50, 1.0), (8 * 60, 1.0)):
            gpu_at(world, monkeypatch, gpu)
            world.clock = morning + timedelta(minutes=minutes)
            world.refresh(measure=True)
        assert world.server()["spec"]["stopped"] is True, world.status()
        world.refresh()
        world.refresh()
        assert world.status()["phase"] == "Stopped"
    # Karpenter removes the empty GPU node half an hour after the last stop; the operator's next
    # check of the stopped server finds it gone.
    world.clock = START + timedelta(days=4, hours=8, minutes=30)
    world.dev_cluster.client().resources.get(api_version="v1", kind="Node").delete(name="gpu-node")
    world.refresh()
    world.clock = START + timedelta(days=7)


def savings(world: World, monkeypatch, *argv: str, who: str = "alice") -> str:
    monkeypatch.setenv("KUBECONFIG", str(world.dev_cluster.kubeconfigs[who]))
    out = io.StringIO()
    assert cli.main(["savings", *argv], out=out) == 0
    return out.getvalue()


def test_a_week_of_idle_stops_reports_what_they_saved(week, monkeypatch):
    run_the_week(week, monkeypatch)
    # By hand. box: 1 of the node's 4 GPUs (its largest share: 8 of 48 vCPU, 40 of 192 GiB),
    # 0.25 node of g5.12xlarge at $5.672/h = $1.418/h. It ran 09:00-17:00 on five days, 40 h
    # (10 node-hours, $56.72), and stood idle-stopped 17:00-09:00 four times and from the fifth
    # day's 17:00 to the end of the week, 4 x 16 + 64 = 128 h. Of each stop the first 8 h count
    # (devServers.idle.countedStopHours): 5 x 8 = 40 h saved (10 node-hours, $56.72), the other
    # 88 h (22 node-hours) forgotten. lab: 4 of 8 vCPU and 16 of 32 GiB, 0.5 node of m6i.2xlarge
    # at $0.384/h = $0.192/h, all 168 h of the week (84 node-hours, $32.256); its day before the
    # week is not counted. Each keeps a 100 GiB gp3 home all week, running or not: 168 h x 100 x
    # $0.08 / 730 h = $1.8411 (KEPT). SAVED: 56.72 / (56.72 + 1.8411 + 56.72) = 49.20 %; in all,
    # 56.72 / (56.72 + 32.256 + 2 x 1.8411 + 56.72) = 37.97 %.
    # The node view: the first four stops saved nothing, the node stayed (bob's or anyone's pods
    # could have kept it); the fifth counts from 17:30, when the operator found the node gone, to
    # its counted end at 01:00: 7.5 h x $1.418 = $10.635, 10.635 / (56.72 + 1.8411 + 10.635) =
    # 15.37 %. bob deletes his server at the end of the week: the ledger keeps its record.
    lab = week.server("lab", "dev-bob")
    week.dev_cluster.client().resources.get(api_version=API_VERSION, kind="DevServer").delete(
        name="lab", namespace="dev-bob"
    )
    week.api.settle()
    operator.on_server_deleted(type="DELETED", body=lab, memo=week.memo)
    report = savings(week, monkeypatch, "--since", "7d", "--all-namespaces", who="admin")
    lines = report.splitlines()
    assert lines[0] == (
        "2026-11-22T09:00:00Z to 2026-11-29T09:00:00Z, 2 servers (1 deleted) (all namespaces)"
    )
    assert re.split(" {2,}", lines[1]) == [
        "USER", "USED NODE-H", "USED $", "KEPT $", "IDLE-STOPPED NODE-H", "SAVED $", "SAVED",
        "NODE VIEW $", "NODE VIEW", "FORGOTTEN NODE-H", "BY HAND NODE-H"]  # fmt: skip
    assert [line.split() for line in lines[2:5]] == [
        ["alice", "10.00", "56.72", "1.84", "10.00", "56.72", "49.2%", "10.63", "15.4%", "22.00",
         "0.00"],
        ["bob", "84.00", "32.26", "1.84", "0.00", "0.00", "0.0%", "0.00", "0.0%", "0.00", "0.00"],
        ["total", "94.00", "88.98", "3.68", "10.00", "56.72", "38.0%", "10.63", "10.3%", "22.00",
         "0.00"],
    ]  # fmt: skip
    assert lines[5].startswith("SAVED: what the idle-stopped servers would have cost running")
    # alice's own, from Friday 21:00: her last stop's counted 8 h ended at 01:00, before it; her
    # home bills its 36 h (0.39).
    mine = savings(week, monkeypatch, "--since", "36h")
    assert ["alice", "0.00", "0.00", "0.39", "0.00", "0.00", "0.0%", "0.00", "0.0%", "9.00",
            "0.00"] in [line.split() for line in mine.splitlines()]  # fmt: skip
    assert "bob" not in mine and "total" not in mine
    # bob reads his deleted server's week from his namespace's ledger, which he may not write.
    assert "84.00" in savings(week, monkeypatch, "--since", "7d", who="bob")
    ledgers = week.dev_cluster.client("bob").resources.get(api_version="v1", kind="ConfigMap")
    with pytest.raises(ForbiddenError):
        ledgers.patch(name=f"devserver-usage-{lab['metadata']['uid']}", namespace="dev-bob",
                      body={"data": {}}, content_type="application/merge-patch+json")  # fmt: skip

    events = week.api.objects("events", "dev-alice")
    box = [(e["type"], e["reason"], e["message"]) for e in events]
    assert (
        box.count(
            (
                "Normal",
                "IdleStop",
                "stopped for idleness: 0.25 node of g5.12xlarge, $1.418/h not spent",
            )
        )
        == 5
    )
    restarts = [m for _, reason, m in box if reason == "IdleRestart"]
    assert (
        restarts
        == [
            "started again after an idle stop of 16.00 h: 4.00 node-hours of g5.12xlarge not used, "
            "$22.69 saved"
        ]
        * 4
    )
    assert all(e["involvedObject"]["name"] == "box" for e in events)
    assert {e["firstTimestamp"][11:] for e in events if e["reason"] == "IdleStop"} == {"17:00:00Z"}

    metrics = generate_latest(week.memo.metrics.registry).decode()
    kind = 'flavor="gpu-1",instance_type="g5.12xlarge",namespace="dev-alice"'
    assert f"devserver_idle_stops_total{{{kind}}} 5.0" in metrics
    assert f"devserver_idle_restarts_total{{{kind}}} 4.0" in metrics
    stopped = (
        'flavor="gpu-1",instance_type="g5.12xlarge",namespace="dev-alice",server="box",'
        'state="idle_stopped"'
    )
    assert f"devserver_usd_per_hour{{{stopped}}} 1.418" in metrics
    assert [r for r in week.api.refusals if "system:serviceaccount" in r] == []


def test_the_record_keeps_35_days():
    """Periods that ended longer ago than the record's reach are dropped; an open one stays."""
    old = {"state": IDLE_STOPPED, "start": "2026-09-01T00:00:00Z", "end": "2026-10-01T00:00:00Z"}
    recent = {"state": IDLE_STOPPED, "start": "2026-10-20T00:00:00Z", "end": "2026-11-01T00:00:00Z"}
    running = {"state": RUNNING, "start": "2026-11-01T00:00:00Z", "instanceType": "t", "nodes": 1}
    for period in (old, recent):
        period.update(instanceType="t", nodes=1)
    change = record([old, recent, running], True, True, False, None, START)
    assert change.usage == [recent, running] and change.events == []


def test_stops_by_hand_are_their_own_kind_and_an_idle_stop_counts_its_first_hours():
    fields = {"instanceType": "g5.12xlarge", "nodes": 0.5, "usdPerHour": 2.836}

    def at(hours: float):
        return START + timedelta(hours=hours)

    running = [{"state": RUNNING, "start": timestamp(at(0)), **fields}]
    stopped = record(running, False, False, False, None, at(2)).usage  # devctl stop
    assert [p["state"] for p in stopped] == [RUNNING, STOPPED] and "end" not in stopped[1]
    started = record(stopped, False, True, False, None, at(5)).usage  # devctl start
    assert started[1]["end"] == timestamp(at(5))
    by_hand = Totals()
    for period in started:
        by_hand.add(period, at(0), at(6))
    assert (by_hand.by_hand_node_hours, by_hand.saved_usd) == (1.5, 0.0)

    idle = record(running, True, True, True, None, at(2), counted_stop_hours=8).usage
    assert idle[1]["state"] == IDLE_STOPPED and idle[1]["countedHours"] == 8
    whole, late = Totals(), Totals()
    for period in idle:
        whole.add(period, at(0), at(32))  # 30 h stopped: 8 counted, 22 forgotten
        late.add(period, at(8), at(32))  # from 6 h into the stop: 2 counted
    assert (whole.stopped_node_hours, whole.forgotten_node_hours) == (4.0, 11.0)
    assert whole.saved_usd == pytest.approx(8 * 2.836)
    assert (late.stopped_node_hours, late.forgotten_node_hours) == (1.0, 11.0)

    # Recorded before the cap existed: no countedHours, the whole stop counts as it did then.
    legacy = Totals()
    for period in idle:
        legacy.add({k: v for k, v in period.items() if k != "countedHours"}, at(0), at(32))
    assert (legacy.stopped_node_hours, legacy.forgotten_node_hours) == (15.0, 0.0)


def test_the_ledger_keeps_deleted_servers_and_bounds_itself():
    """A deleted server's copy ends at its deletion, or at its last write where the operator did
    not see the deletion; a live server's copy is not counted twice, nor one deleted before the
    period, nor one that does not read; deleted copies go after RETENTION, and the oldest first
    beyond MAX_DELETED in a namespace."""

    def server(name, uid):
        return {"metadata": {"name": name, "namespace": "dev-alice", "uid": uid},
                "spec": {"owner": "alice", "flavor": "gpu-1"}}  # fmt: skip

    running = [{"state": RUNNING, "start": timestamp(START), "instanceType": "t", "nodes": 1.0,
                "nodeNames": ["ip-10-0-0-1"]}]  # fmt: skip
    later = START + timedelta(hours=3)
    seen = ledger_copy(server("seen", "1"), running, later, deleted=True)
    unseen = ledger_copy(server("unseen", "2"), running, START + timedelta(hours=2))
    live = {**server("live", "3"), "status": {"usage": running}}
    long_gone = ledger_copy(server("old", "4"), running, START - timedelta(days=2), deleted=True)
    edited = {**ledger_copy(server("edited", "5"), running, START), "data": {"record": "{"}}
    ledgers = [seen, unseen, ledger_copy(live, running, START), long_gone, edited]
    assert "nodeNames" not in seen["data"]["record"]  # the operator's own business
    found = with_deleted([live], ledgers, START - timedelta(days=1))
    assert [s["metadata"]["name"] for s in found] == ["live", "seen", "unseen"]
    assert [s["status"]["usage"][-1].get("end") for s in found] == [
        None, timestamp(later), timestamp(START + timedelta(hours=2))]  # fmt: skip
    assert found[1]["metadata"]["deletedAt"] == timestamp(later)
    totals = report(found, START, START + timedelta(hours=10))["alice"]
    assert totals.used_node_hours == 10 + 3 + 2

    # 36 days on, the deleted copies age out; the live one and the unseen one stay.
    month = START + timedelta(days=36)
    assert sorted(expired(ledgers, month)) == [
        ("devserver-usage-1", False), ("devserver-usage-4", False)]  # fmt: skip
    # Past MAX_DELETED deleted servers within retention, the oldest go (each announced).
    many = [
        ledger_copy(server(f"s{i}", f"u{i:03}"), running, START + timedelta(minutes=i), True)
        for i in range(MAX_DELETED + 2)
    ]
    assert expired(many, START + timedelta(days=1)) == [
        ("devserver-usage-u000", True), ("devserver-usage-u001", True)]  # fmt: skip


def test_a_copy_that_fails_holds_up_no_stop_and_is_written_again(week, monkeypatch):
    """The ledger is written last and best effort: a refusal (say the API server's) leaves the
    idle stop, its record and its Event as they would be, and the next reconcile copies it."""
    week.create(lifecycle={"idleTimeout": "30m"})
    cluster = week.memo.cluster
    get = cluster.get

    def refusing(api_version, kind, name, namespace):
        if kind == "ConfigMap" and name.startswith(LEDGER_PREFIX):
            raise OSError("etcdserver: request timed out")
        return get(api_version, kind, name, namespace)

    monkeypatch.setattr(cluster, "get", refusing)
    gpu_at(week, monkeypatch, 1.0)
    for minutes in (20, 30):  # the warning, then the stop it announced
        week.clock = START + timedelta(minutes=minutes)
        week.refresh(measure=True)
    week.refresh()
    week.refresh()
    assert (
        week.status()["phase"] == "Stopped" and week.status()["usage"][-1]["state"] == IDLE_STOPPED
    )
    assert ("dev-alice", "box") in week.memo.unwritten
    uid = week.server()["metadata"]["uid"]

    def copied() -> list[str]:
        copy = week.api.read("configmaps", "dev-alice", f"{LEDGER_PREFIX}{uid}")
        return [p["state"] for p in json.loads(copy["data"]["record"])["usage"]]

    assert copied() == [RUNNING]  # as copied when it started

    monkeypatch.setattr(cluster, "get", get)
    week.refresh()
    assert copied() == [RUNNING, IDLE_STOPPED] and week.memo.unwritten == set()


def test_past_its_counted_hours_a_stop_stops_looking_for_its_nodes():
    fields = {"instanceType": "g5.12xlarge", "nodes": 0.25, "usdPerHour": 1.418}
    stopped = [{"state": IDLE_STOPPED, "start": timestamp(START), "countedHours": 8,
                "nodeNames": ["n-1"], **fields}]  # fmt: skip
    asked = []

    def gone(names):
        asked.append(names)
        return True

    def at(hours):
        return record(stopped, False, False, False, None, START + timedelta(hours=hours), gone=gone)

    assert at(7).usage[0]["nodesGoneAt"] == timestamp(START + timedelta(hours=7))
    assert "nodesGoneAt" not in at(9).usage[0] and asked == [["n-1"]]


def test_a_deleted_server_past_the_namespaces_limit_drops_the_oldest_copy_and_says_so(week):
    """With MAX_DELETED deleted servers' copies already in the namespace, one more deletion drops
    the oldest, through the operator's RBAC, with a Warning Event."""
    configmaps = week.admin.resources.get(api_version="v1", kind="ConfigMap")
    running = [{"state": RUNNING, "start": timestamp(START), "instanceType": "t", "nodes": 1.0}]
    for i in range(MAX_DELETED):
        gone = {"metadata": {"name": f"s{i}", "namespace": "dev-alice", "uid": f"u{i:03}"},
                "spec": {"owner": "alice", "flavor": "gpu-1"}}  # fmt: skip
        moment = START - timedelta(days=1) + timedelta(minutes=i)
        configmaps.create(body=ledger_copy(gone, running, moment, True), namespace="dev-alice")
    box = week.create()
    week.dev_cluster.client("alice").resources.get(
        api_version=API_VERSION, kind="DevServer"
    ).delete(name="box", namespace="dev-alice")
    week.api.settle()
    operator.on_server_deleted(type="DELETED", body=box, memo=week.memo)
    week.api.settle()  # the operator deletes in the foreground: the garbage collector finishes
    names = week.names("configmaps")
    assert f"devserver-usage-{box['metadata']['uid']}" in names
    assert "devserver-usage-u000" not in names and "devserver-usage-u001" in names
    dropped = [
        e for e in week.api.objects("events", "dev-alice") if e["reason"] == "UsageRecordDropped"
    ]
    assert [e["type"] for e in dropped] == ["Warning"] and "devserver-usage-u000" in dropped[0][
        "message"
    ]
    assert week.api.refusals == []
