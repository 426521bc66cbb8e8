"""The operator's reconcile (devservers.controller through devservers.operator._refresh) on the
local Kubernetes API: the real client boundary (devservers.kube) with the operator's
ServiceAccount and RBAC, a StatefulSet controller, the garbage collector, and pods that are
processes of their own (the activity probe execs into them). The clock is the test's, so idle
timeouts take no time; kopf's own wiring is tested by test_devservers_rbac with the real
operator process."""

import shutil
import sys
from datetime import UTC, datetime, timedelta

import kopf
import pytest
from kubernetes import config

from devservers import operator
from devservers.activity import pod_activity
from devservers.api import API_VERSION, GPU, QUEUE_LABEL
from devservers.controller import KUEUE_GATE
from devservers.kube import KubeCluster
from devservers.render import SHAPE_ANNOTATION, Settings, host_public_key
from tests.devservers_cluster import Cluster
from tests.test_devservers_render import KEY
from tests.test_devservers_render import server as server_manifest

START = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
GROUP = API_VERSION.split("/")[0]


class World:
    """The dev stack's API, the operator's cluster boundary and a clock the test moves."""

    def __init__(self, dev_cluster: Cluster, monkeypatch, settings: Settings | None = None):
        self.dev_cluster, self.api = dev_cluster, dev_cluster.api
        client = config.new_client_from_config(str(dev_cluster.kubeconfigs["operator"]))
        self.memo = kopf.Memo(cluster=KubeCluster(client), settings=settings or Settings())
        self.users = {"alice": dev_cluster.client("alice")}
        self.clock = START
        monkeypatch.setattr(operator, "now", lambda: self.clock)

    def server(self, name="box", namespace="dev-alice") -> dict:
        return self.dev_cluster.server(name, namespace)

    def status(self, name="box") -> dict:
        return self.server(name).get("status") or {}

    def refresh(self, name="box", measure=False) -> None:
        """The operator's reconcile of one server, then the dev_cluster's controllers."""
        operator._refresh(self.memo, name, "dev-alice", measure)
        self.api.settle()

    def create(self, name="box", **spec) -> dict:
        manifest = server_manifest(**spec)
        manifest["metadata"] = {"name": name, "namespace": "dev-alice"}
        servers = self.users["alice"].resources.get(api_version=API_VERSION, kind="DevServer")
        servers.create(body=manifest, namespace="dev-alice")
        self.refresh(name)
        self.refresh(name)  # once the pods run
        return self.server(name)

    def patch(self, kind: str, name: str, body: dict, namespace: str | None = "dev-alice"):
        resource = self.dev_cluster.client().resources.get(api_version=API_VERSION, kind=kind)
        resource.patch(
            name=name, namespace=namespace, body=body, content_type="application/merge-patch+json"
        )

    def names(self, plural: str, group: str = "") -> set[str]:
        return self.dev_cluster.names(plural, group=group)

    def writes(self) -> list[str]:
        """The operator's requests so far that were not reads."""
        account = "system:serviceaccount:devservers-system:devserver-operator"
        return [
            request
            for who, request in self.api.requests
            if who == account and not request.startswith(("get ", "list ", "watch "))
        ]


@pytest.fixture
def world(dev_cluster, monkeypatch):
    return World(dev_cluster, monkeypatch)


def test_create_renders_the_children_and_reports_running(world):
    status = world.create()["status"]
    assert {"box", "box-ssh"} <= world.names("services")
    assert world.names("configmaps") >= {"box-scripts"}
    assert world.names("statefulsets", "apps") == {"box"}
    assert "home-box-0" in world.names("persistentvolumeclaims")
    assert status["phase"] == "Running" and status["replicasReady"] == 1
    assert status["sshEndpoint"] == "box-ssh.dev-alice.svc:22"
    assert status["lastActivity"] == "2026-11-22T09:00:00Z"
    # The host key: made once, in a Secret of the server's that its pod mounts; its public half
    # in the status, which devctl reads (users may not read Secrets).
    secret = world.api.read("secrets", "dev-alice", "box-ssh-host-key")
    assert secret["metadata"]["ownerReferences"][0]["name"] == "box"
    assert status["sshHostKey"] == host_public_key(secret)
    assert world.api.refusals == []


def test_deleting_the_host_key_secret_rotates_the_key(world):
    first = world.create()["status"]["sshHostKey"]
    world.refresh()
    assert world.status()["sshHostKey"] == first  # kept while its Secret is there
    secrets = world.dev_cluster.client().resources.get(api_version="v1", kind="Secret")
    secrets.delete(name="box-ssh-host-key", namespace="dev-alice")  # an administrator rotates it
    world.refresh()
    secret = world.api.read("secrets", "dev-alice", "box-ssh-host-key")
    assert world.status()["sshHostKey"] == host_public_key(secret) != first
    assert world.api.refusals == []


def test_a_steady_state_check_only_reads(world):
    world.create()
    world.refresh(measure=True)  # the first check records what it saw
    written, before = len(world.writes()), len(world.api.requests)
    world.refresh(measure=True)
    world.refresh()
    assert len(world.writes()) == written
    reads = [r for _, r in world.api.requests[before:]]
    assert "get /api/v1/namespaces/dev-alice/pods/box-0/exec" in reads


def test_pods_held_by_kueue_show_as_queued_until_admitted(world):
    def gate(kind, obj):  # Kueue's pod webhook: pods of a queued workload start gated
        if kind.kind == "Pod" and obj["metadata"]["namespace"] == "dev-alice":
            obj["spec"]["schedulingGates"] = [{"name": KUEUE_GATE}]

    world.api.admission.append(gate)
    assert world.create()["status"]["phase"] == "Queued"
    pods = world.dev_cluster.client().resources.get(api_version="v1", kind="Pod")
    admitted = [{"op": "remove", "path": "/spec/schedulingGates"}]  # what Kueue does on admission
    pods.patch(
        name="box-0",
        namespace="dev-alice",
        body=admitted,
        content_type="application/json-patch+json",
    )
    world.api.settle()
    world.refresh()
    assert world.status()["phase"] == "Running"


def test_a_resized_flavor_replaces_the_pods_and_keeps_the_home(world):
    world.create()
    old = world.api.read("statefulsets", "dev-alice", "box", group="apps")
    home = world.api.read("persistentvolumeclaims", "dev-alice", "home-box-0")
    two = {GPU: "2"}
    body = {"spec": {"resources": {"requests": two, "limits": two}}}
    world.patch("DevServerFlavor", "gpu-1", body, namespace=None)
    world.refresh()
    assert world.status()["reason"] == "Replacing"
    world.refresh()
    world.refresh()
    new = world.api.read("statefulsets", "dev-alice", "box", group="apps")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    annotations = new["metadata"]["annotations"], old["metadata"]["annotations"]
    assert annotations[0][SHAPE_ANNOTATION] != annotations[1][SHAPE_ANNOTATION]
    limits = new["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits[GPU] == "2"
    kept = world.api.read("persistentvolumeclaims", "dev-alice", "home-box-0")
    assert kept["metadata"]["uid"] == home["metadata"]["uid"]
    assert world.status()["phase"] == "Running"


def test_an_idle_server_stops_to_zero_and_keeps_its_home(world):
    world.create(lifecycle={"idleTimeout": "30m"})
    world.clock = START + timedelta(minutes=20)
    world.refresh(measure=True)
    assert not world.server()["spec"].get("stopped")  # not idle long enough yet
    world.clock = START + timedelta(minutes=31)
    world.refresh(measure=True)
    assert world.server()["spec"]["stopped"] is True
    assert world.status()["reason"] == "Idle"
    world.refresh()  # kopf: the spec changed
    assert world.api.read("statefulsets", "dev-alice", "box", group="apps")["spec"]["replicas"] == 0
    world.refresh()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Stopped", "Idle")
    assert "devctl start box" in status["message"]
    assert "home-box-0" in world.names("persistentvolumeclaims")
    assert "box-0" not in world.names("pods")


@pytest.fixture
def session_program(tmp_path):
    """A program whose process name is OpenSSH 9.8's per-session one."""
    path = tmp_path / "sshd-session"
    shutil.copy("/bin/sleep", path)
    return str(path)


@pytest.mark.parametrize("use", ["ssh session", "process", "gpu"])
def test_activity_keeps_a_server_running(world, use, session_program, monkeypatch):
    world.create(lifecycle={"idleTimeout": "30m"})
    pod = world.api.read("pods", "dev-alice", "box-0")
    commands = {
        "ssh session": [[session_program, "300"], [session_program, "300"]],
        "process": [[sys.executable, "-c", "import time; time.sleep(300)"]],
        "gpu": [],
    }[use]
    started = [world.api.runtime.run_in(pod, command) for command in commands]
    if use == "gpu":  # no GPU and no DCGM exporter here: the boundary reports a busy GPU
        monkeypatch.setattr(world.memo.cluster, "gpu_utilization", lambda *_: 87.0)
    world.clock = START + timedelta(hours=3)
    try:
        world.refresh(measure=True)
    finally:
        for process in started:
            process.kill()
            process.wait()
    assert not world.server()["spec"].get("stopped")
    assert world.status()["lastActivity"] == "2026-11-22T12:00:00Z"
    assert world.status()["activeSessions"] == (1 if use == "ssh session" else 0)


def test_auto_shutdown_off_never_stops(world):
    world.create(lifecycle={"idleTimeout": "30m", "autoShutdown": False})
    world.clock = START + timedelta(days=2)
    world.refresh(measure=True)
    assert not world.server()["spec"].get("stopped")


def test_restart_brings_the_pods_back_with_a_fresh_idle_clock(world):
    world.create(lifecycle={"idleTimeout": "30m"})
    world.patch("DevServer", "box", {"spec": {"stopped": True}})
    world.refresh()
    world.refresh()
    assert world.status()["phase"] == "Stopped"
    world.clock = START + timedelta(hours=5)
    world.patch("DevServer", "box", {"spec": {"stopped": False}})
    world.refresh()
    world.refresh()
    status = world.status()
    assert status["phase"] == "Running" and status["lastActivity"] == "2026-11-22T14:00:00Z"
    world.clock += timedelta(minutes=10)
    world.refresh(measure=True)
    assert not world.server()["spec"].get("stopped")


@pytest.mark.parametrize(("delete_home", "home_left"), [(False, True), (True, False)])
def test_delete_cleans_children_by_owner_reference(world, delete_home, home_left):
    world.create(lifecycle={"deleteHomeOnDelete": delete_home})
    world.refresh()  # adopts the home claim if asked
    world.users["alice"].resources.get(api_version=API_VERSION, kind="DevServer").delete(
        name="box", namespace="dev-alice"
    )
    world.api.settle()
    assert world.server() is None
    for plural, group in [("statefulsets", "apps"), ("services", ""), ("pods", "")]:
        assert not world.names(plural, group), plural
    assert ("home-box-0" in world.names("persistentvolumeclaims")) is home_left


def test_unknown_flavor_and_foreign_namespace_fail_with_a_reason(world):
    world.create(flavor="gpu-9")
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Failed", "UnknownFlavor")
    assert "allowed: a100-8, cpu-small, gpu-1, gpu-4" in status["message"]
    world.create(name="sneaky", owner="bob")
    assert world.status("sneaky")["reason"] == "NotOwnerNamespace"
    assert "sneaky" not in world.names("statefulsets", "apps")


def test_distributed_servers_get_world_size_pods_and_homes(world):
    world.create(mode="distributed", distributed={"worldSize": 3, "backend": "nccl"})
    assert {f"box-{i}" for i in range(3)} <= world.names("pods")
    assert {f"home-box-{i}" for i in range(3)} <= world.names("persistentvolumeclaims")
    assert world.status()["replicasReady"] == 3
    sts = world.api.read("statefulsets", "dev-alice", "box", group="apps")
    assert sts["metadata"]["labels"][QUEUE_LABEL] == "dev"


def test_switching_ssh_to_a_load_balancer_recreates_the_ssh_service(dev_cluster, monkeypatch):
    world = World(dev_cluster, monkeypatch, Settings(ssh_cidrs=("203.0.113.0/24",)))
    world.create()
    ssh = {"serviceType": "LoadBalancer", "authorizedKeys": [KEY]}
    world.patch("DevServer", "box", {"spec": {"ssh": ssh}})
    world.refresh()
    world.refresh()
    service = world.api.read("services", "dev-alice", "box-ssh")
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["loadBalancerSourceRanges"] == ["203.0.113.0/24"]
    assert world.status().get("sshEndpoint") is None  # until AWS gives it an address


def test_process_lists_count_sessions_and_ignore_the_servers_own():
    assert not pod_activity("start.sh\nsshd\nsleep\nsh\ncat\n").active
    assert pod_activity("sshd\nsshd\nsshd\nbash\n").ssh_sessions == 1
    assert (
        pod_activity("sshd\nsshd-session\nsshd-session\nsshd-session\nsshd-session\n").ssh_sessions
        == 2
    )
