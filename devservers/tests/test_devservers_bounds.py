"""No user can stall the operator: every exec and API call it makes is bounded in time, in the
connection as well as the reads, and an exec in what it takes in; the idle check runs servers
at once, so a server whose shell hangs delays no other's stop beyond its exec's bound. The
hanging and flooding shells are real: a `cat` of the pod's own (the activity probe runs
`cat /proc/[0-9]*/stat`) that sleeps or prints without end, first on the pod's PATH, as a
user's image or the user can put it there. The bounds are shortened here to keep the tests fast;
the operator's are in devservers.kube."""

import asyncio
import socket
import time
from datetime import timedelta

import pytest
from kubernetes import client

from devservers import kube, operator
from devservers.activity import PROBE, ProbeCut
from devservers.kube import KubeCluster
from devservers.render import CONTAINER
from devservers.tests.test_devservers_operator import START, World, gpu_at
from tests.kube_api.kubelet import IMAGE_BIN

HANGS = "#!/bin/sh\nexec sleep 60\n"
FLOODS = "#!/bin/sh\nexec yes devserver-flood-devserver-flood\n"


def shadow_cat(world: World, pod: str, script: str) -> None:
    world.api.runtime.write(world.api.read("pods", "dev-alice", pod), f"{IMAGE_BIN}/cat", script)


@pytest.fixture
def world(dev_cluster, monkeypatch):
    monkeypatch.setattr(kube, "EXEC_SECONDS", 4.0)
    monkeypatch.setattr(kube, "EXEC_OUTPUT_BYTES", 1 << 20)
    return World(dev_cluster, monkeypatch)


def test_a_hung_shell_delays_no_other_servers_idle_stop(world, monkeypatch):
    """Four GPU servers idle past their timeout and warned; the first checked (names sort) has a
    shell that never answers. The other three are stopped within a second or two of the check's
    start, long before the hung one's exec is cut at its bound; the check ends at that bound."""
    names = ["a-hung", "b", "c", "d"]
    for name in names:
        world.create(name, lifecycle={"idleTimeout": "30m"})
    gpu_at(world, monkeypatch, 1.0)
    shadow_cat(world, "a-hung-0", HANGS)
    servers = [("dev-alice", name) for name in names]
    world.clock = START + timedelta(minutes=21)
    asyncio.run(operator.sweep(world.memo, servers))  # the warning
    assert all(world.status(name).get("conditions") for name in names)

    stops, patch = {}, world.memo.cluster.patch

    def spy(api_version, kind, name, namespace, body):
        if body.get("spec", {}).get("stopped"):
            stops[name] = time.monotonic() - started
        return patch(api_version, kind, name, namespace, body)

    monkeypatch.setattr(world.memo.cluster, "patch", spy)
    world.clock = START + timedelta(minutes=31)
    started = time.monotonic()
    took = asyncio.run(operator.sweep(world.memo, servers))
    assert kube.EXEC_SECONDS <= took < kube.EXEC_SECONDS + 3
    assert set(stops) == set(names)  # the hung one too: nothing showed it in use
    assert max(stops[name] for name in names[1:]) < kube.EXEC_SECONDS / 2, stops
    assert stops["a-hung"] >= kube.EXEC_SECONDS
    message = world.status("a-hung")["message"]
    assert "idle (no SSH session and GPUs at or below 5%)" in message


def test_an_exec_flooding_output_is_cut_at_the_cap(world):
    """The probe's `cat` prints without end: the exec is closed once it passed the cap, and a
    CPU server whose activity cannot be read is judged idle (its users cannot keep it running
    by breaking the probe)."""
    world.create(flavor="cpu-small", lifecycle={"idleTimeout": "30m"})
    shadow_cat(world, "box-0", FLOODS)
    started = time.monotonic()
    with pytest.raises(ProbeCut, match=r"exec in dev-alice/box-0: more than 1048576 bytes"):
        world.memo.cluster.exec("dev-alice", "box-0", CONTAINER, PROBE)
    assert time.monotonic() - started < kube.EXEC_SECONDS
    world.clock = START + timedelta(minutes=31)
    world.refresh(measure=True)
    (warning,) = world.status()["conditions"]
    assert warning["message"].startswith(
        "idle (no activity readable: exec in dev-alice/box-0: more than 1048576 bytes of "
        "output; cut) since 2026-11-22T09:00:00Z: stops at"
    )


def test_a_connection_that_never_answers_is_bounded(monkeypatch):
    """An API server (or its proxy to a node) that takes the connection and never answers: the
    websocket upgrade of an exec fails after EXEC_CONNECT_SECONDS, an API request after
    API_TIMEOUT per attempt (urllib3 retries an idempotent request three times)."""
    monkeypatch.setattr(kube, "EXEC_CONNECT_SECONDS", 1.0)
    monkeypatch.setattr(kube, "API_TIMEOUT", (1.0, 1.0))
    silent = socket.create_server(("127.0.0.1", 0), backlog=16)
    try:
        configuration = client.Configuration(host=f"http://127.0.0.1:{silent.getsockname()[1]}")
        configuration.api_key = {"authorization": "token"}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        cluster = KubeCluster(client.ApiClient(configuration))
        started = time.monotonic()
        with pytest.raises(ProbeCut, match="exec in dev-alice/box-0: no answer within 1 s"):
            cluster.exec("dev-alice", "box-0", CONTAINER, PROBE)
        assert time.monotonic() - started < 3
        started = time.monotonic()
        with pytest.raises(OSError, match="cannot reach the Kubernetes API server"):
            cluster.get("v1", "Namespace", "dev-alice", None)
        assert time.monotonic() - started < 4 * 1.0 + 3
    finally:
        silent.close()
