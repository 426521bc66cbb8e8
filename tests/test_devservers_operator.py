"""The operator's kopf handlers against an in-memory API (devservers.fake_cluster): create,
flavor change, idle stop, restart, delete, and idempotence."""

from datetime import UTC, datetime, timedelta

import kopf
import pytest

from devservers import operator
from devservers.activity import pod_activity
from devservers.api import API_VERSION
from devservers.fake_cluster import FakeCluster
from devservers.render import SHAPE_ANNOTATION, Settings
from tests.test_devservers_crds import gpu_flavor
from tests.test_devservers_render import KEY
from tests.test_devservers_render import server as server_manifest

START = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)


class World:
    """A fake cluster plus the clock, and kopf's part: calling handlers and applying patches."""

    def __init__(self, monkeypatch):
        self.cluster = FakeCluster()
        self.memo = kopf.Memo(cluster=self.cluster, settings=Settings())
        self.clock = START
        monkeypatch.setattr(operator, "now", lambda: self.clock)
        self.cluster.create(gpu_flavor())

    def server(self, name="box", namespace="dev-alice") -> dict:
        return self.cluster.get(API_VERSION, "DevServer", name, namespace)

    def handle(self, handler, name="box", namespace="dev-alice") -> kopf.Patch:
        patch = kopf.Patch()
        handler(body=kopf.Body(self.server(name, namespace)), patch=patch, memo=self.memo)
        if patch.get("spec"):
            self.cluster.patch(API_VERSION, "DevServer", name, namespace, {"spec": patch["spec"]})
        self.cluster.patch_status(name, namespace, patch.get("status", {}))
        return patch

    def create(self, **spec) -> dict:
        manifest = server_manifest(**spec)
        del manifest["metadata"]["uid"]
        self.cluster.create(manifest)
        self.handle(operator.on_server)
        self.cluster.settle()
        self.handle(operator.on_server)
        return self.server()

    def kinds(self) -> set[str]:
        return {f"{k[1]}/{k[3]}" for k in self.cluster.objects}


@pytest.fixture
def world(monkeypatch):
    return World(monkeypatch)


def test_create_renders_the_children_and_reports_running(world):
    status = world.create()["status"]
    assert {
        "ConfigMap/box-scripts",
        "Service/box",
        "Service/box-ssh",
        "StatefulSet/box",
    } <= world.kinds()
    assert "PersistentVolumeClaim/home-box-0" in world.kinds()
    assert status["phase"] == "Running" and status["replicasReady"] == 1
    assert status["sshEndpoint"] == "box-ssh.dev-alice.svc:22"
    assert status["lastActivity"] == "2026-11-22T09:00:00Z"


def test_reconcile_is_idempotent(world):
    world.create()
    before = len(world.cluster.writes)
    world.handle(operator.on_server)
    world.handle(operator.check_activity)
    assert world.cluster.writes[before:] == []


def test_pods_held_by_kueue_show_as_queued_until_admitted(world):
    world.cluster.admit = False
    assert world.create()["status"]["phase"] == "Queued"
    world.cluster.admit_pending()
    operator.on_pod(
        labels={"dev.training-platform.io/server": "box"}, namespace="dev-alice", memo=world.memo
    )
    assert world.server()["status"]["phase"] == "Running"


def test_a_resized_flavor_replaces_the_pods_and_keeps_the_home(world):
    world.create()
    old_sts = world.cluster.get("apps/v1", "StatefulSet", "box", "dev-alice")
    home = world.cluster.get("v1", "PersistentVolumeClaim", "home-box-0", "dev-alice")
    world.cluster.patch(
        API_VERSION,
        "DevServerFlavor",
        "gpu-1",
        None,
        {
            "spec": {
                "resources": {
                    "requests": {"nvidia.com/gpu": "2"},
                    "limits": {"nvidia.com/gpu": "2"},
                }
            }
        },
    )
    operator.on_flavor(name="gpu-1", memo=world.memo)
    assert world.server()["status"]["reason"] == "Replacing"
    assert ("delete", "StatefulSet", "box") in world.cluster.writes
    world.cluster.settle()  # the old pods and StatefulSet go
    world.handle(operator.on_server)
    world.cluster.settle()
    world.handle(operator.on_server)
    new_sts = world.cluster.get("apps/v1", "StatefulSet", "box", "dev-alice")
    assert new_sts["metadata"]["uid"] != old_sts["metadata"]["uid"]
    assert (
        new_sts["metadata"]["annotations"][SHAPE_ANNOTATION]
        != old_sts["metadata"]["annotations"][SHAPE_ANNOTATION]
    )
    limits = new_sts["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "2"
    kept = world.cluster.get("v1", "PersistentVolumeClaim", "home-box-0", "dev-alice")
    assert kept["metadata"]["uid"] == home["metadata"]["uid"]
    assert world.server()["status"]["phase"] == "Running"


def test_an_idle_server_stops_to_zero_and_keeps_its_home(world):
    world.create(lifecycle={"idleTimeout": "30m"})
    world.clock = START + timedelta(minutes=20)
    assert "spec" not in world.handle(operator.check_activity)  # not idle long enough yet
    world.clock = START + timedelta(minutes=31)
    patch = world.handle(operator.check_activity)
    assert patch["spec"] == {"stopped": True}
    assert world.server()["status"]["reason"] == "Idle"
    world.handle(operator.on_server)  # kopf: the spec changed
    sts = world.cluster.get("apps/v1", "StatefulSet", "box", "dev-alice")
    assert sts["spec"]["replicas"] == 0
    world.cluster.settle()
    world.handle(operator.on_server)
    status = world.server()["status"]
    assert (status["phase"], status["reason"]) == ("Stopped", "Idle")
    assert "devctl start box" in status["message"]
    assert "PersistentVolumeClaim/home-box-0" in world.kinds()
    assert "Pod/box-0" not in world.kinds()


@pytest.mark.parametrize(
    ("processes", "gpu"),
    [
        ("start.sh\nsshd\nsshd-session\nsshd-session\nbash\n", None),  # someone is logged in
        ("start.sh\nsshd\npython\n", None),  # a run left behind with nohup
        ("start.sh\nsshd\n", 87.0),  # a GPU kernel busy
    ],
)
def test_activity_keeps_a_server_running(world, processes, gpu):
    world.create(lifecycle={"idleTimeout": "30m"})
    world.cluster.processes["box-0"] = processes
    world.cluster.gpu = gpu
    world.clock = START + timedelta(hours=3)
    assert "spec" not in world.handle(operator.check_activity)
    assert world.server()["status"]["lastActivity"] == "2026-11-22T12:00:00Z"


def test_auto_shutdown_off_never_stops(world):
    world.create(lifecycle={"idleTimeout": "30m", "autoShutdown": False})
    world.clock = START + timedelta(days=2)
    assert "spec" not in world.handle(operator.check_activity)


def test_restart_brings_the_pods_back_with_a_fresh_idle_clock(world):
    world.create(lifecycle={"idleTimeout": "30m"})
    world.cluster.patch(API_VERSION, "DevServer", "box", "dev-alice", {"spec": {"stopped": True}})
    world.handle(operator.on_server)
    world.cluster.settle()
    world.handle(operator.on_server)
    assert world.server()["status"]["phase"] == "Stopped"
    world.clock = START + timedelta(hours=5)
    world.cluster.patch(API_VERSION, "DevServer", "box", "dev-alice", {"spec": {"stopped": False}})
    world.handle(operator.on_server)
    world.cluster.settle()
    world.handle(operator.on_server)
    status = world.server()["status"]
    assert status["phase"] == "Running" and status["lastActivity"] == "2026-11-22T14:00:00Z"
    world.clock += timedelta(minutes=10)
    assert "spec" not in world.handle(operator.check_activity)


@pytest.mark.parametrize(("delete_home", "home_left"), [(False, True), (True, False)])
def test_delete_cleans_children_by_owner_reference(world, delete_home, home_left):
    world.create(lifecycle={"deleteHomeOnDelete": delete_home})
    world.handle(operator.on_server)  # adopts the home claim if asked
    world.cluster.delete(API_VERSION, "DevServer", "box", "dev-alice")
    world.cluster.settle()
    assert not any(k[3].startswith("box") for k in world.cluster.objects)
    assert ("PersistentVolumeClaim/home-box-0" in world.kinds()) is home_left


def test_unknown_flavor_and_foreign_namespace_fail_with_a_reason(world):
    world.create(flavor="gpu-9")
    status = world.server()["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "UnknownFlavor")
    assert "allowed: gpu-1" in status["message"]
    manifest = server_manifest(owner="bob")
    manifest["metadata"] |= {"name": "sneaky"}
    del manifest["metadata"]["uid"]
    world.cluster.create(manifest)
    world.handle(operator.on_server, name="sneaky")
    assert world.server("sneaky")["status"]["reason"] == "NotOwnerNamespace"
    assert "StatefulSet/sneaky" not in world.kinds()


def test_distributed_servers_get_world_size_pods_and_homes(world):
    world.create(mode="distributed", distributed={"worldSize": 3, "backend": "nccl"})
    assert {f"Pod/box-{i}" for i in range(3)} <= world.kinds()
    assert {f"PersistentVolumeClaim/home-box-{i}" for i in range(3)} <= world.kinds()
    assert world.server()["status"]["replicasReady"] == 3


def test_process_lists_count_sessions_and_ignore_the_servers_own():
    assert not pod_activity("start.sh\nsshd\nsleep\nsh\ncat\n").active
    assert pod_activity("sshd\nsshd\nsshd\nbash\n").ssh_sessions == 1
    assert (
        pod_activity("sshd\nsshd-session\nsshd-session\nsshd-session\nsshd-session\n").ssh_sessions
        == 2
    )


def test_the_benchmark_runs_and_its_steady_state_writes_nothing(capsys):
    from devservers.bench import main

    main(["--servers", "4"])
    printed = capsys.readouterr().out
    assert "4 DevServers" in printed and "writes: 0" in printed


def test_switching_ssh_to_a_load_balancer_recreates_the_ssh_service(world):
    world.memo = kopf.Memo(cluster=world.cluster, settings=Settings(ssh_cidrs=("203.0.113.0/24",)))
    world.create()
    ssh = {"serviceType": "LoadBalancer", "authorizedKeys": [KEY]}
    world.cluster.patch(API_VERSION, "DevServer", "box", "dev-alice", {"spec": {"ssh": ssh}})
    world.handle(operator.on_server)
    world.cluster.settle()
    world.handle(operator.on_server)
    service = world.cluster.get("v1", "Service", "box-ssh", "dev-alice")
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["loadBalancerSourceRanges"] == ["203.0.113.0/24"]
    assert world.server()["status"].get("sshEndpoint") is None  # until AWS gives it an address


def test_an_unchanged_server_gets_no_status_write_either(world):
    world.create()
    world.handle(operator.on_server)
    assert world.handle(operator.on_server) == {}
