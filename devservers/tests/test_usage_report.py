"""`devctl usage`: a scripted day on the local Kubernetes API, with the dev plan's RBAC, counted by
hand. Kueue's Workloads, the operators' pods, Karpenter's nodes and the DevServer operator's usage
record are left as those controllers write them (devservers/usage_report.py names the fields); the
usage recorder (usagerecorder/recorder.py) runs as the dev stack's CronJob runs it, with its
ServiceAccount's token, before and after a job and a node go."""

import copy
import csv
import io
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from devservers import cli
from devservers.api import API_VERSION, crds, parse_timestamp, timestamp
from devservers.savings import ledger_copy
from infra.core.catalog import load_prices
from infra.core.nodes import POOL_LABEL
from infra.kueue.tests.kueue_rules import WORKLOAD_VERSION
from infra.operators.tests.job_crds import job_crds
from tests.kube_api import ADMIN, KubeAPI, rbac_of, service_account, user
from tests.kube_api.least_privilege import granted, used
from tests.kube_api.rbac import Authorizer
from tests.plugin import ROOT
from usagerecorder.records import RECORD_LABEL, RECORD_NAMESPACE

TEAM, OTHER, ALICE_NS = "team-a", "research", "dev-alice"
PRICES = load_prices("us-west-2")
OD = PRICES.instance("g5.12xlarge")  # gpu-small's one type
P4D = PRICES.instance("p4d.24xlarge")  # gpu-large's
P4D_SPOT = PRICES.spot_usd_per_hour["p4d.24xlarge"]
CPU_OD = PRICES.instance("m6i.2xlarge")


def ago(now: datetime, hours: float) -> str:
    return timestamp(now - timedelta(hours=hours))


class Recorder:
    """The dev stack's usage recorder CronJob: its image's ENTRYPOINT with this interpreter and
    the CronJob's args, as its ServiceAccount."""

    def __init__(self, api, plan, tmp_path):
        cronjob = plan.one("kubernetes:batch/v1:CronJob", "usage-recorder").inputs
        pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        dockerfile = (ROOT / "usagerecorder" / "Dockerfile").read_text()
        entrypoint = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M).group(1))
        assert entrypoint[0] == "python"
        self.command = [sys.executable, *entrypoint[1:], *container["args"]]
        self.namespace = cronjob["metadata"]["namespace"]
        self.name = pod["serviceAccountName"]
        self.account = service_account(self.namespace, self.name)
        config = tmp_path / "kubeconfig-recorder"
        config.write_text(yaml.safe_dump(api.kubeconfig(api.add_token(self.account))))
        self.env = {**os.environ, "KUBECONFIG": str(config), "PYTHONPATH": str(ROOT),
                    "TMPDIR": str(tmp_path)}  # fmt: skip
        self.env.pop("KUBERNETES_SERVICE_HOST", None)
        self.api = api

    def run(self) -> datetime:
        """One run; returns when it started."""
        started = datetime.now().astimezone()
        done = self.process(self.command)
        assert done.returncode == 0, done.stdout + done.stderr
        assert self.api.refusals == []
        return started

    def process(self, command: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(command, cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=60)  # fmt: skip


@pytest.fixture(scope="module")
def day(dev_plan, tmp_path_factory):
    """The cluster as it stands at `now`, after a day of work (hours before now):
    - nodes: gpu-small On-Demand since 10, gpu-large spot since 6, cpu On-Demand since 4 (idle);
    - team-a's job a: the 4 GPUs of the gpu-small node, admitted 10 to 2, finished;
    - team-a's job b: admitted 2 h before an eviction (Kueue keeps that as seconds), admitted
      again 5 h ago, running on 4 of the spot p4d's 8 GPUs;
    - research's job c: admitted 3 h ago, running on the spot node's other 4;
    - alice's DevServer: a quarter of a gpu-small node from 4 to 1, and one she deleted: 7 to 5;
      Kueue's Workload of her server's pods, which her server's record already counts;
    - team-a's job e: a whole gpu-small node of its own (on-demand, made 9 h ago), admitted 7 h
      ago; the usage recorder runs, then the job is deleted (its Workload with it) and the node
      goes, Kueue evicts research's c, and the recorder runs again: only its record is left of
      e and its node, and c's ends at the eviction;
    - team-a's job f: 4 GPUs of the gpu-small node, admitted 1 h ago, after the recorder ran."""
    api = KubeAPI(Authorizer(rbac_of(dev_plan))).start()
    served = {(k.group, k.plural): k for k in api.kinds.values()}
    for crd in [*job_crds(), *crds()]:
        api.call(api.create, served[("apiextensions.k8s.io", "customresourcedefinitions")], "", crd)
    for namespace in (TEAM, OTHER, ALICE_NS, RECORD_NAMESPACE):
        api.call(api.create, served[("", "namespaces")], "", {"metadata": {"name": namespace}})
    api.settle()
    served = {(k.group, k.plural): k for k in api.kinds.values()}
    now = datetime.now().astimezone()

    def put(group, plural, namespace, body):
        status = body.pop("status", None)
        created = api.call(api.create, served[(group, plural)], namespace, body)
        if status is not None:
            created = api.call(
                api.replace, served[(group, plural)], created, {**created, "status": status}
            )
        return created

    def backdate(key, hours):
        """The creation time the controller's object had: the local API stamps its own."""

        def stamp():
            api.store[key]["metadata"]["creationTimestamp"] = ago(now, hours)

        api.call(stamp)

    def node(name, pool, instance, capacity, since):
        labels = {POOL_LABEL: pool, "node.kubernetes.io/instance-type": instance,
                  "karpenter.sh/capacity-type": capacity}  # fmt: skip
        put("", "nodes", "", {"metadata": {"name": name, "labels": labels}})
        backdate(("", "nodes", "", name), since)

    def job(namespace, name, pool, gpus, on, admitted, finished=None, past=0, created=None):
        # The job first: the garbage collector deletes a Workload whose owner does not exist.
        replicas = {"Worker": {"template": {"spec": {"containers": []}}}}
        meta = put("kubeflow.org", "pytorchjobs", namespace, {
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": replicas},
        })["metadata"]  # fmt: skip
        usage = {"nvidia.com/gpu": str(gpus), "cpu": str(gpus * 10), "memory": f"{gpus * 40}Gi"}
        conditions = [{"type": "Admitted", "status": "True", "reason": "Admitted",
                       "lastTransitionTime": ago(now, admitted)}]  # fmt: skip
        if finished is not None:
            conditions.append({"type": "Finished", "status": "True", "reason": "Succeeded",
                               "lastTransitionTime": ago(now, finished)})  # fmt: skip
        owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name,
                 "uid": meta["uid"], "controller": True}  # fmt: skip
        workload = put("kueue.x-k8s.io", "workloads", namespace, {
            "apiVersion": f"kueue.x-k8s.io/{WORKLOAD_VERSION}", "kind": "Workload",
            "metadata": {"name": f"pytorchjob-{name}", "ownerReferences": [owner]},
            "spec": {"queueName": namespace, "podSets": [{"name": "worker", "count": 1}]},
            "status": {
                "conditions": conditions,
                "admission": {"clusterQueue": f"team-{namespace}", "podSetAssignments": [
                    {"name": "worker", "flavors": {"nvidia.com/gpu": pool},
                     "resourceUsage": usage, "count": 1}]},
                **({"accumulatedPastExecutionTimeSeconds": past} if past else {}),
            },
        })  # fmt: skip
        if created is not None:
            backdate(
                ("kueue.x-k8s.io", "workloads", namespace, workload["metadata"]["name"]), created
            )
        labels = {"training.kubeflow.org/job-name": name,
                  "training.kubeflow.org/operator-name": "pytorchjob-controller"}  # fmt: skip
        put("", "pods", namespace, {
            "metadata": {"name": f"{name}-worker-0", "labels": labels,
                         "ownerReferences": [{**owner, "blockOwnerDeletion": True}]},
            "spec": {**({"nodeName": on} if on else {}),
                     "containers": [{"name": "pytorch", "image": "x"}]},
        })  # fmt: skip

    node("n-od", "gpu-small", "g5.12xlarge", "on-demand", 10)
    node("n-spot", "gpu-large", "p4d.24xlarge", "spot", 6)
    node("n-idle", "cpu", "m6i.2xlarge", "on-demand", 4)
    job(TEAM, "a", "gpu-small", 4, "n-od", admitted=10, finished=2)
    job(TEAM, "b", "gpu-large", 4, "n-spot", admitted=5, past=7200, created=12)
    job(OTHER, "c", "gpu-large", 4, "n-spot", admitted=3)
    job(OTHER, "d", "hybrid", 1, None, admitted=2)  # on a machine outside AWS
    flavor = next(
        f.inputs["metadata"]["name"]
        for f in dev_plan.of_type(f"kubernetes:{API_VERSION}:DevServerFlavor")
        if f.inputs["spec"]["nodePool"] == "gpu-small"
    )
    put(API_VERSION.split("/")[0], "devservers", ALICE_NS, {
        "apiVersion": API_VERSION, "kind": "DevServer",
        "metadata": {"name": "box"},
        "spec": {"owner": "alice", "flavor": flavor, "image": "x"},
        "status": {"usage": [{"state": "Running", "start": ago(now, 4), "end": ago(now, 1),
                              "instanceType": "g5.12xlarge", "nodes": 0.25,
                              "usdPerHour": 0.25 * OD}]},
    })  # fmt: skip
    # Her server `old`, deleted 5 h ago after 2 h on a quarter of a gpu-small node: the
    # operator's copy of its record, as it writes it at the deletion.
    gone = {"metadata": {"name": "old", "namespace": ALICE_NS, "uid": "u-old"},
            "spec": {"owner": "alice", "flavor": flavor}}  # fmt: skip
    ran = [{"state": "Running", "start": ago(now, 7), "instanceType": "g5.12xlarge",
            "nodes": 0.25, "usdPerHour": 0.25 * OD}]  # fmt: skip
    put("", "configmaps", ALICE_NS, ledger_copy(gone, ran, now - timedelta(hours=5), True))
    member = next(
        e.inputs
        for e in dev_plan.of_type("aws:eks/accessEntry:AccessEntry")
        if e.inputs.get("kubernetesGroups") == [f"team:{TEAM}"]
    )
    api.member = user(member["principalArn"], member["kubernetesGroups"])

    # Kueue's Workload of alice's server (a pod group: owned by its pods, no controller).
    put("kueue.x-k8s.io", "workloads", ALICE_NS, {
        "apiVersion": f"kueue.x-k8s.io/{WORKLOAD_VERSION}", "kind": "Workload",
        "metadata": {"name": "box-pods"},
        "spec": {"queueName": "dev", "podSets": [{"name": "main", "count": 1}]},
        "status": {
            "conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted",
                            "lastTransitionTime": ago(now, 4)}],
            "admission": {"clusterQueue": "team-a", "podSetAssignments": [
                {"name": "main", "flavors": {"nvidia.com/gpu": "gpu-small"},
                 "resourceUsage": {"nvidia.com/gpu": "1", "cpu": "10", "memory": "40Gi"},
                 "count": 1}]},
        },
    })  # fmt: skip
    node("n-gone", "gpu-small", "g5.12xlarge", "on-demand", 9)
    job(TEAM, "e", "gpu-small", 4, "n-gone", admitted=7)
    # Maps past the kept days, and a ConfigMap that is no record.
    stale = {"metadata": {"name": "usage-jobs-2020-01-01", "labels": {RECORD_LABEL: "jobs"}},
             "data": {"x": "{}"}}  # fmt: skip
    for namespace in (TEAM, OTHER):
        put("", "configmaps", namespace, copy.deepcopy(stale))
    old_nodes = {"name": "usage-nodes-2020-01-01", "labels": {RECORD_LABEL: "nodes"}}
    put("", "configmaps", RECORD_NAMESPACE, {"metadata": old_nodes})
    put("", "configmaps", TEAM, {"metadata": {"name": "settings"}, "data": {"a": "b"}})
    api.settle()
    recorder = Recorder(api, dev_plan, tmp_path_factory.mktemp("recorder"))
    api.recorder, api.plan = recorder, dev_plan
    api.first_run = recorder.run()
    # Kueue evicts c (preempted): its quota goes back, its admission with it, and the time it
    # ran joins its accumulated execution time (Kueue pkg/workload/workload.go, v0.19.2).
    evicted = api.read("workloads", OTHER, "pytorchjob-c", group="kueue.x-k8s.io")
    api.evicted_at = timestamp(datetime.now())
    conditions = [
        {"type": kind, "status": status, "reason": "Preempted", "message": "preempted",
         "lastTransitionTime": api.evicted_at}
        for kind, status in (("QuotaReserved", "False"), ("Admitted", "False"), ("Evicted", "True"))
    ]  # fmt: skip
    status = {"conditions": conditions, "accumulatedPastExecutionTimeSeconds": 3 * 3600}
    api.call(api.replace, served[("kueue.x-k8s.io", "workloads")], evicted,
             {**evicted, "status": status})  # fmt: skip
    for plural, namespace, name, group in (
        ("pytorchjobs", TEAM, "e", "kubeflow.org"),
        ("nodes", "", "n-gone", ""),
    ):
        found = api.read(plural, namespace, name, group=group)
        api.call(api.delete, served[(group, plural)], found)
    api.settle()  # the garbage collector deletes job e's Workload and pod
    assert api.read("workloads", TEAM, "pytorchjob-e", group="kueue.x-k8s.io") is None
    recorder.run()
    # Admitted since the recorder's last run: nothing recorded of it yet.
    job(TEAM, "f", "gpu-small", 4, "n-od", admitted=1)
    api.settle()
    yield api
    api.stop()


def usage(api, who, tmp_path, monkeypatch, capsys, *argv) -> tuple[int, str]:
    """`devctl usage` as `who` runs it: exit code, and what it printed (errors on stderr)."""
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump(api.kubeconfig(api.add_token(who), TEAM)))
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the client's discovery cache
    out = io.StringIO()
    code = cli.main(["usage", "--stack", "dev", *argv], out=out)
    return code, out.getvalue() + capsys.readouterr().err


def rows(text: str) -> dict[tuple[str, str, str], dict]:
    return {(r["team"], r["what"], r["name"]): r for r in csv.DictReader(io.StringIO(text))}


def test_the_platform_view_counts_the_day_by_hand(day, tmp_path, monkeypatch, capsys):
    code, text = usage(
        day, ADMIN, tmp_path, monkeypatch, capsys, "-A", "--since", "1d", "--format", "csv"
    )
    assert code == 0, text
    found = rows(text)
    expected = {
        # team, what, name: capacity, GPU-hours, node-hours, USD
        (TEAM, "job", "PyTorchJob/a"): ("on-demand", 4 * 8, 8, 8 * OD),
        # 2 h before the eviction (created 12 h ago: inside the day) and 5 h since: half a node.
        (TEAM, "job", "PyTorchJob/b"): ("spot", 4 * 7, 0.5 * 7, 0.5 * 7 * P4D_SPOT),
        # Evicted: from its record (its Workload's sum of past admissions is not counted twice).
        (OTHER, "job", "PyTorchJob/c"): ("spot", 4 * 3, 0.5 * 3, 0.5 * 3 * P4D_SPOT),
        # box 3 h, and the deleted `old` 2 h, from its copy.
        (ALICE_NS, "devserver", "alice"): ("list", 4 * 0.25 * 5, 0.25 * 5, 0.25 * 5 * OD),
        # Deleted with its node: from the recorder's record, 7 h to its first run.
        (TEAM, "job", "PyTorchJob/e"): ("on-demand", 4 * 7, 7, 7 * OD),
        (TEAM, "job", "PyTorchJob/f"): ("on-demand", 4, 1, OD),
    }
    for key, want in expected.items():
        capacity, gpu_hours, node_hours, usd = want
        line = found[key]
        assert line["capacity"] == capacity, key
        assert float(line["gpu_hours"]) == pytest.approx(gpu_hours, abs=0.01), key
        assert float(line["node_hours"]) == pytest.approx(node_hours, abs=0.01), key
        assert float(line["usd"]) == pytest.approx(usd, rel=0.01), key
    # The hybrid machines' pool has no EC2 price: its GPU-hours, no node share, no dollars.
    hybrid = found[(OTHER, "job", "PyTorchJob/d")]
    assert (hybrid["capacity"], hybrid["node_hours"], hybrid["usd"]) == ("unpriced", "0.0", "")
    assert float(hybrid["gpu_hours"]) == pytest.approx(2, abs=0.01)
    # Alice's server once: no job line for Kueue's Workload of its pods.
    assert not [key for key in found if key[0] == ALICE_NS and key[1] == "job"]
    # The pools' nodes: gpu-small 10 h and the gone node's 9 h On-Demand, gpu-large 6 h spot,
    # cpu 4 h; idle is the rest.
    provisioned = [r for r in found.values() if r["what"] == "nodes"]
    assert sorted(
        (r["pool"], r["capacity"], round(float(r["node_hours"]), 1)) for r in provisioned
    ) == [("cpu", "on-demand", 4.0), ("gpu-large", "spot", 6.0), ("gpu-small", "on-demand", 19.0)]
    idle = {r["pool"]: r for r in found.values() if r["what"] == "idle"}
    # gpu-small: 19 h less job a's 8, e's 7, f's 1 and alice's 1.25; gpu-large: 6 h less b's
    # 3.5 and c's 1.5.
    assert float(idle["gpu-small"]["node_hours"]) == pytest.approx(1.75, abs=0.02)
    assert float(idle["gpu-small"]["usd"]) == pytest.approx(1.75 * OD, rel=0.02)
    assert float(idle["gpu-large"]["node_hours"]) == pytest.approx(1.0, abs=0.01)
    assert float(idle["gpu-large"]["usd"]) == pytest.approx(P4D_SPOT, rel=0.02)
    assert float(idle["cpu"]["node_hours"]) == pytest.approx(4, abs=0.01)
    assert float(idle["cpu"]["usd"]) == pytest.approx(4 * CPU_OD, rel=0.01)


def test_the_docs_show_the_days_report_as_it_prints(day, tmp_path, monkeypatch, capsys):
    code, text = usage(day, ADMIN, tmp_path, monkeypatch, capsys, "-A", "--since", "1d")
    assert code == 0, text
    page = (ROOT / "docs" / "platform" / "capacity-and-cost.md").read_text()
    shown = page.split("$ .venv/bin/devctl usage -A --since 1d\nTEAM ")[1].split("```")[0]
    printed = text.split("TEAM ", 1)[1].split("\n2026-")[0]

    def rows(table: str) -> dict[str, list[str]]:
        found = {}
        for line in ("TEAM " + table).strip().splitlines():
            words = [w for w in line.split() if not re.fullmatch(r"[\d,.]+|-", w)]
            found[" ".join(words)] = [w for w in line.split() if w not in words]
        return found

    shown, printed = rows(shown), rows(printed)
    assert list(shown) == list(printed)
    for name, figures in printed.items():
        for want, got in zip(shown[name], figures, strict=True):
            if want == "-" or got == "-":
                assert want == got, name
            else:  # the report's now moves on from the fixture's: a minute's drift
                number = float(got.replace(",", ""))
                assert float(want.replace(",", "")) == pytest.approx(number, abs=0.05, rel=0.01)


def test_a_member_sees_her_team_priced_at_the_recorded_nodes_or_list_and_no_other_team(
    day, tmp_path, monkeypatch, capsys
):
    code, text = usage(day, day.member, tmp_path, monkeypatch, capsys, "--since", "1d")
    assert code == 0, text
    lines = text.splitlines()
    assert lines[0].split() == [
        "TEAM",
        "WHAT",
        "NAME",
        "POOL",
        "CAPACITY",
        "GPU-H",
        "NODE-H",
        "USD",
    ]
    found = {
        name: next(line.split() for line in lines if f"PyTorchJob/{name}" in line)
        for name in "abef"
    }
    # She may not read nodes: what the recorder saw them run on (a, b, and e, which is gone),
    # or, for f, which it has not seen yet, the pool's type at its On-Demand price, as `list`.
    # The report's now is a little after the fixture's: figures within a minute's drift.
    expected = {
        "a": ("gpu-small", "on-demand", [32, 8, 8 * OD]),
        "b": ("gpu-large", "spot", [28, 3.5, 3.5 * P4D_SPOT]),
        "e": ("gpu-small", "on-demand", [28, 7, 7 * OD]),
        "f": ("gpu-small", "list", [4, 1, OD]),
    }
    for name, (pool, capacity, figures) in expected.items():
        row = found[name]
        assert row[3:5] == [pool, capacity], name
        assert [float(x.replace(",", "")) for x in row[5:]] == pytest.approx(figures, rel=0.01)
    assert "PyTorchJob/c" not in text  # research's
    assert not any(line.split()[1:2] in (["idle"], ["nodes"]) for line in lines)
    assert "nodes not readable with these rights" in text
    assert "infra/core/catalog/prices/us-west-2.yaml" in text
    code, text = usage(day, day.member, tmp_path, monkeypatch, capsys, "-n", OTHER)
    assert code != 0 and f"not allowed to read the jobs of namespace {OTHER}" in text


def test_json_holds_the_same_lines_and_says_what_priced_them(day, tmp_path, monkeypatch, capsys):
    code, text = usage(day, ADMIN, tmp_path, monkeypatch, capsys, "-A", "--format", "json")
    assert code == 0, text
    report = json.loads(text)
    assert report["nodesRead"] is True and report["scope"] == "all namespaces"
    assert parse_timestamp(report["until"]) - parse_timestamp(report["since"]) == timedelta(days=7)
    assert {(r["team"], r["name"]) for r in report["lines"] if r["what"] == "job"} == {
        (TEAM, "PyTorchJob/a"), (TEAM, "PyTorchJob/b"), (OTHER, "PyTorchJob/c"),
        (OTHER, "PyTorchJob/d"), (TEAM, "PyTorchJob/e"), (TEAM, "PyTorchJob/f")}  # fmt: skip


def records(api, namespace: str) -> dict[str, dict]:
    return {
        key: json.loads(text)
        for found in api.objects("configmaps", namespace)
        if (found["metadata"].get("labels") or {}).get(RECORD_LABEL)
        for key, text in (found.get("data") or {}).items()
    }


def test_the_recorder_keeps_what_went_and_closes_it_at_the_run_that_last_saw_it(day):
    first = timestamp(day.first_run)
    (e,) = [r for r in records(day, TEAM).values() if r["job"] == "PyTorchJob/e"]
    assert e["open"] is False
    assert e["from"] < first <= e["to"] < timestamp(day.first_run + timedelta(minutes=1))
    usage = {"nvidia.com/gpu": "4", "cpu": "40", "memory": "160Gi"}
    on = {"instanceTypes": ["g5.12xlarge"], "capacities": ["on-demand"]}
    assert e["podSets"] == [{"name": "worker", "pool": "gpu-small", "usage": usage, **on}]
    # What still runs stays open; nothing of alice's namespace is recorded (her server's own
    # record counts it).
    assert {r["job"] for r in records(day, TEAM).values() if r["open"]} == {"PyTorchJob/b"}
    assert {r["job"] for r in records(day, OTHER).values() if r["open"]} == {"PyTorchJob/d"}
    (c,) = [r for r in records(day, OTHER).values() if r["job"] == "PyTorchJob/c"]
    assert c["to"] == day.evicted_at and c["podSets"][0]["capacities"] == ["spot"]
    assert records(day, ALICE_NS) == {}
    nodes = {r["name"]: r for r in records(day, RECORD_NAMESPACE).values()}
    assert set(nodes) == {"n-od", "n-spot", "n-idle", "n-gone"}
    assert nodes["n-gone"]["open"] is False and nodes["n-spot"]["capacity"] == "spot"
    # Days past billing.usageRecordDays go; a ConfigMap that is no record stays.
    names = {n: {c["metadata"]["name"] for c in day.objects("configmaps", n)}
             for n in (TEAM, OTHER, RECORD_NAMESPACE)}  # fmt: skip
    assert not {"usage-jobs-2020-01-01", "usage-nodes-2020-01-01"} & set().union(*names.values())
    assert "settings" in names[TEAM]
    # Least privilege: the plan grants its ServiceAccount exactly what it used, where it used it.
    recorder = day.recorder
    assert granted(day.plan, recorder.name, recorder.namespace) == used(day, recorder.account.name)


def test_a_member_reads_her_teams_records_and_can_change_none(day, tmp_path):
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump(day.kubeconfig(day.add_token(day.member), TEAM)))
    core = k8s_client.CoreV1Api(k8s_config.new_client_from_config(str(config)))
    found, *_ = core.list_namespaced_config_map(TEAM, label_selector=RECORD_LABEL).items
    patch = {"data": {"forged": "{}"}}
    for attempt in (
        lambda: core.patch_namespaced_config_map(found.metadata.name, TEAM, patch),
        lambda: core.delete_namespaced_config_map(found.metadata.name, TEAM),
        lambda: core.list_namespaced_config_map(RECORD_NAMESPACE),
        lambda: core.list_namespaced_config_map(OTHER),
    ):
        with pytest.raises(k8s_client.ApiException) as refused:
            attempt()
        assert refused.value.status == 403


def test_a_namespace_the_recorder_may_not_read_fails_the_run_and_no_other(day):
    """A team namespace whose RBAC is not there yet (a team added, its Role not applied): that
    namespace is named and the run fails, and the others are recorded all the same."""
    recorder = day.recorder
    command = [a for a in recorder.command if not a.startswith("--namespaces=")]
    before = records(day, TEAM)
    done = recorder.process([*command, f"--namespaces={ALICE_NS},{TEAM}"])
    refused = list(day.refusals)
    day.refusals.clear()
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(f"usagerecorder: namespace {ALICE_NS} not recorded: 403 ")
    assert "Traceback" not in done.stderr and any(ALICE_NS in r for r in refused)
    # team-a was recorded all the same: job f, admitted since the last run, is in it now.
    after = records(day, TEAM)
    assert set(after) > set(before) and "PyTorchJob/f" in {r["job"] for r in after.values()}
