"""The operator's reconcile (devservers.controller through devservers.operator._refresh) on the
local Kubernetes API: the real client boundary (devservers.kube) with the operator's
ServiceAccount and RBAC, a StatefulSet controller, the garbage collector, and pods that are
processes of their own (the activity probe execs into them). The clock is the test's, so idle
timeouts take no time; kopf's own wiring is tested by test_devservers_rbac with the real
operator process."""

import io
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path

import kopf
import pytest
from kubernetes import config

from devservers import cli, devctl, operator
from devservers.activity import pod_activity
from devservers.api import API_VERSION, GPU, QUEUE_LABEL
from devservers.controller import KUEUE_GATE, WARN, WARN_BEFORE, parse_timestamp
from devservers.kube import KubeCluster, settings_from_env
from devservers.render import CONTAINER, SHAPE_ANNOTATION, host_public_key
from devservers.tests.test_devservers_render import IMAGE, KEY, TRAINER_REPOSITORY
from devservers.tests.test_devservers_render import server as server_manifest
from tests.devservers_cluster import Cluster, wait_for
from tests.openssh import OpenSsh
from trainer.launch import children

START = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
GROUP = API_VERSION.split("/")[0]


class World:
    """The dev stack's API, the operator's cluster boundary (its settings from the plan's
    Deployment, with `settings` laid over them) and a clock the test moves."""

    def __init__(self, dev_cluster: Cluster, monkeypatch, user: str = "alice", **settings):
        self.dev_cluster, self.api = dev_cluster, dev_cluster.api
        client = config.new_client_from_config(str(dev_cluster.kubeconfigs["operator"]))
        self.memo = operator.with_state(
            kopf.Memo(),
            KubeCluster(client),
            replace(settings_from_env(dev_cluster.operator_env), **settings),
        )
        self.users = {user: dev_cluster.client(user)}
        self.clock = START
        monkeypatch.setattr(operator, "now", lambda: self.clock)
        monkeypatch.setattr(devctl, "now", lambda: self.clock)
        monkeypatch.setenv("KUBECONFIG", str(dev_cluster.kubeconfigs[user]))

    @cached_property
    def admin(self):
        """A platform administrator's client."""
        return self.dev_cluster.client()

    def devctl(self, *argv: str) -> str:
        """devctl as alice runs it (her kubeconfig), on the test's clock."""
        out = io.StringIO()
        assert cli.main(list(argv), out=out) == 0
        return out.getvalue()

    def server(self, name="box", namespace="dev-alice") -> dict:
        return self.dev_cluster.server(name, namespace)

    def status(self, name="box") -> dict:
        return self.server(name).get("status") or {}

    def refresh(self, name="box", measure=False, namespace="dev-alice") -> None:
        """The operator's reconcile of one server, then the dev_cluster's controllers."""
        operator._refresh(self.memo, name, namespace, measure)
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
        resource = self.admin.resources.get(api_version=API_VERSION, kind=kind)
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


@pytest.mark.parametrize("seen", ["at its deletion", "at a pod event after"])
def test_pods_left_by_a_server_deleted_with_orphan_propagation_are_stopped(world, seen):
    """A user may delete her server with propagationPolicy Orphan: its StatefulSet and pods would
    run on with no idle stop and no record. The operator deletes them when it sees the server's
    deletion, or (down then) at the pods' next event."""
    server = world.create()
    servers = world.users["alice"].resources.get(api_version=API_VERSION, kind="DevServer")
    servers.delete(name="box", namespace="dev-alice", body={"propagationPolicy": "Orphan"})
    world.api.settle()
    assert world.names("statefulsets", "apps") == {"box"} and "box-0" in world.names("pods")
    if seen == "at its deletion":
        operator.on_server_deleted(type="DELETED", body=server, memo=world.memo)
    else:
        labels = world.api.read("pods", "dev-alice", "box-0")["metadata"]["labels"]
        operator.on_pod(type="MODIFIED", labels=labels, namespace="dev-alice", memo=world.memo)
    world.api.settle()
    assert world.names("statefulsets", "apps") == set() and "box-0" not in world.names("pods")
    assert world.api.refusals == []


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


def stops_when_checked(world: World) -> bool:
    """Whether a check now finds the server idle past its stop: it warns first (a stop at this
    check only if a warning stood before it), and the check WARN_BEFORE later (the server still
    idle) stops it."""
    warned = bool(world.status().get("conditions"))
    world.refresh(measure=True)
    if world.server()["spec"].get("stopped"):
        assert warned, "stopped without a warning"
        return True
    if world.status().get("conditions"):
        world.clock += WARN_BEFORE
        world.refresh(measure=True)
    return bool(world.server()["spec"].get("stopped"))


def test_an_idle_server_stops_to_zero_and_keeps_its_home(world):
    world.create(lifecycle={"idleTimeout": "30m"})
    world.clock = START + timedelta(minutes=20)
    world.refresh(measure=True)
    assert not world.server()["spec"].get("stopped")  # not idle long enough yet
    world.clock = START + timedelta(minutes=31)
    assert stops_when_checked(world)
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


def run_in_pod(world: World, *commands: list[str]) -> list[subprocess.Popen]:
    pod = world.api.read("pods", "dev-alice", "box-0")
    return [world.api.runtime.run_in(pod, command) for command in commands]


@pytest.fixture
def in_pod(world):
    """run_in_pod for a test, returning once the pod shows each command's program (the kubelet
    enters the pod's namespaces first: measured before, it was not yet there, seen once in a
    loaded suite); what it starts is killed when the test ends."""
    started = []

    def start(*commands: list[str]) -> list[subprocess.Popen]:
        pod = world.api.read("pods", "dev-alice", "box-0")
        new = run_in_pod(world, *commands)
        started.extend(new)
        # /proc/<pid>/stat's name: the program's file name, cut to 15 characters.
        wanted = Counter(Path(command[0]).name[:15] for command in commands)
        deadline = time.monotonic() + 30
        while Counter(world.api.runtime.processes(pod)) & wanted != wanted:
            assert time.monotonic() < deadline, (wanted, world.api.runtime.processes(pod))
            time.sleep(0.05)
        return new

    yield start
    for process in started:
        process.kill()
        process.wait()


def gpu_at(world: World, monkeypatch, percent: float) -> None:
    """No GPU and no DCGM exporter here: the figure is given at the boundary that reads it
    (KubeCluster.gpu_utilization; its parsing is tested on the exporter's text elsewhere)."""
    monkeypatch.setattr(world.memo.cluster, "gpu_utilization", lambda *_: percent)


@pytest.fixture
def tmux(tmp_path):
    """A tmux server started in the pod, as the pod's user, with a shell in its one pane, as a
    user leaves it; its socket in a directory of that user's."""
    directory = tmp_path / "tmux"
    directory.mkdir()
    socket = str(directory / "socket")

    def start(world: World) -> str:
        world.api.runtime.account.own(directory)
        (started,) = run_in_pod(world, ["tmux", "-S", socket, "new-session", "-d", "bash"])
        assert started.wait(30) == 0
        assert subprocess.run(["tmux", "-S", socket, "has-session"], check=False).returncode == 0
        return socket

    yield start
    subprocess.run(["tmux", "-S", socket, "kill-server"], capture_output=True, check=False)


def pane(socket: str) -> str:
    return subprocess.run(
        ["tmux", "-S", socket, "capture-pane", "-p", "-J", "-S", "-"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.mark.parametrize("use", ["ssh session", "kept process", "gpu"])
def test_activity_keeps_a_server_running(world, in_pod, use, session_program, monkeypatch):
    keep = {"keepAliveProcesses": ["python"]} if use == "kept process" else {}
    world.create(lifecycle={"idleTimeout": "30m", **keep})
    commands = {
        "ssh session": [[session_program, "300"], [session_program, "300"]],
        "kept process": [[sys.executable, "-c", "import time; time.sleep(300)"]],
        "gpu": [],
    }[use]
    in_pod(*commands)
    gpu_at(world, monkeypatch, 87.0 if use == "gpu" else 1.0)
    world.clock = START + timedelta(hours=3)
    world.refresh(measure=True)
    assert not world.server()["spec"].get("stopped")
    assert world.status()["lastActivity"] == "2026-11-22T12:00:00Z"
    assert world.status()["activeSessions"] == (1 if use == "ssh session" else 0)
    reason = {
        "ssh session": "an SSH session",
        "kept process": "process python (keepAliveProcesses)",
        "gpu": "GPU above 5%",
    }[use]
    assert world.status()["lastActivityReason"] == reason
    assert f"last activity:   2026-11-22T12:00:00Z ({reason})" in world.devctl("monitor", "box")


@pytest.mark.parametrize("left", ["shell in tmux", "idle python"])
def test_what_is_left_running_does_not_keep_an_idle_gpu_server(
    world, in_pod, monkeypatch, tmux, left
):
    """Failed before this rule: any process the server had not started kept it running."""
    world.create(lifecycle={"idleTimeout": "30m"})
    if left == "shell in tmux":
        tmux(world)
    else:  # an idle notebook kernel
        in_pod([sys.executable, "-c", "import time; time.sleep(300)"])
    gpu_at(world, monkeypatch, 2.0)
    world.clock = START + timedelta(minutes=31)
    assert stops_when_checked(world)
    message = world.status()["message"]
    assert message.startswith("idle (no SSH session and GPUs at or below 5%) since 2026-11-22T09")


def test_processes_the_owner_names_keep_it(world, monkeypatch, tmux):
    world.create(lifecycle={"idleTimeout": "30m", "keepAliveProcesses": ["tmux: server"]})
    tmux(world)
    gpu_at(world, monkeypatch, 2.0)
    world.clock = START + timedelta(minutes=31)
    assert not stops_when_checked(world)
    assert "conditions" not in world.status()


@pytest.mark.parametrize(
    ("lifecycle", "platform", "stopped"),
    [({}, 5, False), ({"idleGpuPercent": 50}, 5, True), ({}, 40, True)],
    ids=["platform default", "the server's floor", "the platform's floor"],
)
def test_the_gpu_floor_is_the_servers_or_the_platforms(
    dev_cluster, monkeypatch, lifecycle, platform, stopped
):
    world = World(dev_cluster, monkeypatch, idle_gpu_percent=platform)
    world.create(lifecycle={"idleTimeout": "30m", **lifecycle})
    gpu_at(world, monkeypatch, 30.0)
    world.clock = START + timedelta(minutes=31)
    assert stops_when_checked(world) is stopped


def cpu_seconds(started: subprocess.Popen) -> float:
    """utime + stime of the process nsenter started in the pod (proc(5))."""
    (pid,) = children(started.pid)
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / 100


@pytest.mark.parametrize("busy", [True, False], ids=["computing", "shell in tmux"])
def test_a_cpu_server_is_judged_by_its_cpu_use_between_checks(world, in_pod, tmux, busy):
    """The clock is the test's, the CPU seconds are real: the test waits until the busy process
    has used a second of CPU between two checks one (test) second apart."""
    world.create(flavor="cpu-small", lifecycle={"idleTimeout": "30m"})
    tmux(world)
    started = in_pod([sys.executable, "-c", "while True: pass"]) if busy else []
    world.clock = START + timedelta(minutes=30, seconds=59)
    world.refresh(measure=True)  # the first CPU sample: nothing to compare with yet
    assert not world.server()["spec"].get("stopped")
    if busy:
        before = cpu_seconds(started[0])
        wait_for(lambda: cpu_seconds(started[0]) > before + 1, "a second of CPU")
    world.clock += timedelta(seconds=1)
    world.refresh(measure=True)
    assert not world.server()["spec"].get("stopped")
    if busy:
        assert world.status()["lastActivityReason"] == "CPU above 10% of a core"
        assert "conditions" not in world.status()
    else:  # idle past its timeout: warned first, stopped WARN_BEFORE later
        (warning,) = world.status()["conditions"]
        assert "CPU at or below 10% of a core" in warning["message"]
        world.clock += timedelta(minutes=10)
        world.refresh(measure=True)
        assert world.server()["spec"]["stopped"] is True
        assert "CPU at or below 10% of a core" in world.status()["message"]


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


def test_an_image_from_elsewhere_is_refused_and_stops_a_server_switched_to_one(world):
    """Only the stack's trainer repository is allowed in the dev stack (no
    allowedImageRegistries): a look-alike is refused with a Warning Event, once; a running
    server whose image is switched to one stops (home kept), or its user could keep it out of
    idle checks with a spec the operator refuses."""
    look_alike = f"{TRAINER_REPOSITORY}.evil.com/tp-dev/trainer:1"
    world.create(name="evil", image=look_alike)
    status = world.status("evil")
    assert (status["phase"], status["reason"]) == ("Failed", "ImageNotAllowed")
    assert status["message"] == (
        f"image {look_alike} is not in a registry this platform allows; allowed: "
        f"{TRAINER_REPOSITORY}"
    )
    assert "evil" not in world.names("statefulsets", "apps")
    world.create()
    assert world.status()["phase"] == "Running"
    world.patch("DevServer", "box", {"spec": {"image": "ghcr.io/someone/miner:1"}})
    world.refresh()
    assert world.status()["reason"] == "ImageNotAllowed"
    assert world.api.read("statefulsets", "dev-alice", "box", group="apps")["spec"]["replicas"] == 0
    assert "box-0" not in world.names("pods")
    assert "home-box-0" in world.names("persistentvolumeclaims")
    events = [
        (e["involvedObject"]["name"], e["type"], e["reason"])
        for e in world.api.objects("events", "dev-alice")
    ]
    assert sorted(events) == [
        ("box", "Warning", "ImageNotAllowed"),
        ("evil", "Warning", "ImageNotAllowed"),
    ]  # one each, though both were reconciled again
    world.patch("DevServer", "box", {"spec": {"image": IMAGE}})
    world.refresh()
    world.refresh()
    assert world.status()["phase"] == "Running"
    assert world.api.refusals == []


def test_distributed_servers_get_world_size_pods_and_homes(world):
    world.create(mode="distributed", distributed={"worldSize": 3, "backend": "nccl"})
    assert {f"box-{i}" for i in range(3)} <= world.names("pods")
    assert {f"home-box-{i}" for i in range(3)} <= world.names("persistentvolumeclaims")
    assert world.status()["replicasReady"] == 3
    sts = world.api.read("statefulsets", "dev-alice", "box", group="apps")
    assert sts["metadata"]["labels"][QUEUE_LABEL] == "dev"


def test_switching_ssh_to_a_load_balancer_recreates_the_ssh_service(dev_cluster, monkeypatch):
    world = World(dev_cluster, monkeypatch, ssh_cidrs=("203.0.113.0/24",))
    world.create()
    ssh = {"serviceType": "LoadBalancer", "authorizedKeys": [KEY]}
    world.patch("DevServer", "box", {"spec": {"ssh": ssh}})
    world.refresh()
    world.refresh()
    service = world.api.read("services", "dev-alice", "box-ssh")
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["loadBalancerSourceRanges"] == ["203.0.113.0/24"]
    assert world.status().get("sshEndpoint") is None  # until AWS gives it an address


def stat_lines(*names: str) -> str:
    """/proc/<pid>/stat lines as the kernel writes them, this process's own, with `names` as
    their comm (the one field pod_activity reads besides the CPU times)."""
    own = Path("/proc/self/stat").read_text()
    rest = own.rpartition(")")[2]
    return "".join(f"{i} ({name}){rest}" for i, name in enumerate(names, start=1))


def test_process_lists_count_sessions_and_ignore_the_servers_own():
    assert pod_activity(stat_lines("start.sh", "sshd", "sleep", "sh", "cat")).user_processes == ()
    assert pod_activity(stat_lines("sshd", "sshd", "sshd", "bash")).ssh_sessions == 1
    sessions = stat_lines("sshd", *["sshd-session"] * 4)
    assert pod_activity(sessions).ssh_sessions == 2
    awkward = pod_activity(stat_lines("tmux: server", "a) (b"))
    assert awkward.user_processes == ("a) (b", "tmux: server")


def test_cpu_seconds_are_the_kernels_own_and_waited_for_childrens():
    """The fields read from /proc/self/stat against times(2), the kernel's other account, after
    a child that spent user and system time (each of the four fields counts)."""
    user, system = "sum(range(5 * 10**6))", "[os.read(f, 1 << 16) for _ in range(5000)]"
    work = f"import os; f = os.open('/dev/zero', os.O_RDONLY); {user}; {system}"
    subprocess.run([sys.executable, "-c", work], check=True)
    line, times = Path("/proc/self/stat").read_text(), os.times()
    assert times.children_user > 0.05 and times.children_system > 0.05
    expected = times.user + times.system + times.children_user + times.children_system
    assert pod_activity(line).cpu_seconds == pytest.approx(expected, abs=0.05)


def test_users_are_warned_ten_minutes_before_an_idle_stop(world, monkeypatch, tmux):
    world.create(lifecycle={"idleTimeout": "30m"})
    socket = tmux(world)
    gpu_at(world, monkeypatch, 1.0)
    world.clock = START + timedelta(minutes=19)
    world.refresh(measure=True)
    assert world.status()["idleStopAt"] == "2026-11-22T09:30:00Z"
    assert "conditions" not in world.status() and "[devserver box]" not in pane(socket)
    assert "in 11m" in world.devctl("list")

    world.clock = START + timedelta(minutes=21)
    world.refresh(measure=True)
    (warning,) = world.status()["conditions"]
    assert (warning["type"], warning["status"]) == ("IdleStopSoon", "True")
    assert warning["message"] == (
        "idle (no SSH session and GPUs at or below 5%) since 2026-11-22T09:00:00Z: stops at "
        "2026-11-22T09:31:00Z (in 10m), home kept; devctl keep box 2h postpones it"
    )  # a full 10 minutes from the first warning: the stop moves from 09:30 to 09:31
    assert f"[devserver box] {warning['message']}" in pane(socket)  # the shell left in tmux
    assert "in 10m (warned)" in world.devctl("list")
    monitor = world.devctl("monitor", "box")
    assert "idle stop:       in 10m (warned)" in monitor
    assert f"warning:         {warning['message']}" in monitor

    world.clock = START + timedelta(minutes=25)
    world.refresh(measure=True)
    assert world.status()["conditions"] == [warning]  # warned once: no new message, no write
    assert pane(socket).count("[devserver box]") == 1
    world.clock = START + timedelta(minutes=31)
    world.refresh(measure=True)
    assert world.server()["spec"]["stopped"] is True
    world.refresh()
    assert "conditions" not in world.status() and "idleStopAt" not in world.status()


def test_a_server_found_idle_past_its_stop_unwarned_is_warned_before_it_stops(world, monkeypatch):
    """No check saw the warning window (the operator down across it, or a slow pass): the first
    check warns and gives the full 10 minutes. Failed before: it stopped the server at once."""
    world.create(lifecycle={"idleTimeout": "30m"})
    gpu_at(world, monkeypatch, 1.0)
    world.clock = START + timedelta(minutes=31)
    world.refresh(measure=True)
    assert not world.server()["spec"].get("stopped")
    (warning,) = world.status()["conditions"]
    assert (
        "since 2026-11-22T09:00:00Z: stops at 2026-11-22T09:41:00Z (in 10m)" in (warning["message"])
    )
    assert world.status()["idleStopAt"] == "2026-11-22T09:41:00Z"
    # A shorter idleTimeout now does not bring the stop before what the warning said.
    world.patch("DevServer", "box", {"spec": {"lifecycle": {"idleTimeout": "15m"}}})
    world.refresh()  # kopf: the spec changed
    world.clock = START + timedelta(minutes=40, seconds=59)
    world.refresh(measure=True)
    assert not world.server()["spec"].get("stopped")
    assert world.status()["conditions"] == [warning]
    world.clock = START + timedelta(minutes=41)
    world.refresh(measure=True)
    assert world.server()["spec"]["stopped"] is True


def test_a_warning_whose_stop_passed_unchecked_is_given_again(world, monkeypatch):
    """Warned at 09:21 of a stop at 09:31, then no check until 12:00 (the operator down): the
    users may have worked meanwhile, unseen, so the first check warns again rather than stop."""
    world.create(lifecycle={"idleTimeout": "30m"})
    gpu_at(world, monkeypatch, 1.0)
    world.clock = START + timedelta(minutes=21)
    world.refresh(measure=True)
    assert world.status()["idleStopAt"] == "2026-11-22T09:31:00Z"
    world.clock = START + timedelta(hours=3)
    world.refresh(measure=True)
    assert not world.server()["spec"].get("stopped")
    (warning,) = world.status()["conditions"]
    assert "stops at 2026-11-22T12:10:00Z (in 10m)" in warning["message"]
    world.clock = START + timedelta(hours=3, minutes=10)
    world.refresh(measure=True)
    assert world.server()["spec"]["stopped"] is True


def test_devctl_keep_postpones_the_stop(world, monkeypatch):
    world.create(lifecycle={"idleTimeout": "30m"})
    gpu_at(world, monkeypatch, 1.0)
    world.clock = START + timedelta(minutes=21)
    world.refresh(measure=True)
    assert world.status()["conditions"]
    kept = world.devctl("keep", "box", "2h")
    assert "devserver/box kept: not stopped for idleness before 2026-11-22T11:21:00Z" in kept
    assert world.server()["spec"]["lifecycle"]["keepUntil"] == "2026-11-22T11:21:00Z"
    world.refresh()  # kopf: the spec changed
    assert world.status()["idleStopAt"] == "2026-11-22T11:21:00Z"
    assert "conditions" not in world.status()  # the warning is withdrawn at once
    world.clock = START + timedelta(minutes=40)
    world.refresh(measure=True)
    assert not world.server()["spec"].get("stopped")
    world.clock = START + timedelta(hours=2, minutes=12)
    world.refresh(measure=True)
    assert "stops at 2026-11-22T11:22:00Z" in world.status()["conditions"][0]["message"]
    world.clock = START + timedelta(hours=2, minutes=22)
    world.refresh(measure=True)
    assert world.server()["spec"]["stopped"] is True


def test_kept_homes_are_listed_after_a_delete_and_a_shrink(world):
    world.create(mode="distributed", distributed={"worldSize": 3, "backend": "nccl"})
    world.create(name="old")
    world.patch("DevServer", "box", {"spec": {"distributed": {"worldSize": 2}}})
    for _ in range(3):  # the pod shape changed: the StatefulSet is replaced
        world.refresh()
    world.users["alice"].resources.get(api_version=API_VERSION, kind="DevServer").delete(
        name="old", namespace="dev-alice"
    )
    world.api.settle()
    assert world.server("old") is None and world.status()["replicasReady"] == 2
    created = world.api.read("persistentvolumeclaims", "dev-alice", "home-box-0")["metadata"]
    world.clock = parse_timestamp(created["creationTimestamp"]) + timedelta(days=2, hours=3)
    homes = {line.split()[0]: line for line in world.devctl("list", "--homes").splitlines()}
    assert homes["home-box-0"].split()[1:] == ["box", "in", "use", "100Gi", "gp3-home", "2d3h"]
    assert "kept: beyond its 2 pods" in homes["home-box-2"]
    assert "kept: server deleted" in homes["home-old-0"]
    assert "efs-shared" not in homes  # not a home
    assert homes["home"] == "home storage quota: 1000Gi"  # its use is the quota controller's
    assert homes["kept"] == (
        "kept homes cost their size until deleted: kubectl -n dev-alice delete pvc home-box-2 "
        "home-old-0"
    )


def test_a_real_ssh_session_keeps_the_server_and_a_warning_reaches_it(world, monkeypatch):
    """OpenSSH's sshd runs in the pod (its process and mount namespaces) as the image's user;
    the real ssh client holds a session with a terminal (-tt), as a user's shell does."""
    world.create(lifecycle={"idleTimeout": "30m"})
    pod = world.api.read("pods", "dev-alice", "box-0")
    gpu_at(world, monkeypatch, 1.0)
    with OpenSsh() as site:
        site.serve("box", "127.0.0.5", inside=world.api.runtime.enter(pod))
        session = subprocess.Popen(
            [*site.client(), "-tt", "box", "echo session-open; exec sleep 60"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert session.stdout.readline().strip() == b"session-open"
            world.clock = START + timedelta(hours=3)
            world.refresh(measure=True)
            assert not world.server()["spec"].get("stopped")
            assert world.status()["activeSessions"] == 1
            # What the operator execs into the pod before an idle stop, here with a session open.
            world.memo.cluster.exec("dev-alice", "box-0", CONTAINER, [*WARN, "stops in 10m\r\n"])
            assert session.stdout.readline().strip() == b"stops in 10m"
        finally:
            session.kill()
            session.wait()
