"""DevServers under the stack's RBAC: the real operator (kopf, as its image runs it) and devctl
(as a user runs it) against the local Kubernetes API (tests.kube_api), which authorizes every
request with the dev plan's Roles, ClusterRoles and bindings and Kubernetes' own verb mapping
(exec and port-forward upgrades need get and create, as from 1.35). A request the stack's RBAC
would refuse fails the test; so does anything that keeps a DevServer or its namespace from
going away while the operator is down (a finalizer)."""

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from devservers.api import API_VERSION
from devservers.savings import LEDGER_PREFIX
from devservers.tests.devserver_pods import serve_pod
from devservers.tests.test_devservers_render import IMAGE
from tests.openssh import OpenSsh

FLAVOR = "cpu-small"


def hours_ago(hours: float) -> str:
    return (datetime.now(UTC) - timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_devserver_lives_and_dies_under_the_stacks_rbac(dev_cluster):
    api, admin = dev_cluster.api, dev_cluster.client()
    servers = admin.resources.get(api_version=API_VERSION, kind="DevServer")
    flavors = admin.resources.get(api_version=API_VERSION, kind="DevServerFlavor")
    # The node the scheduler binds the pods to: the operator reads its instance type.
    node = {"name": "ip-10-20-1-5", "labels": {"node.kubernetes.io/instance-type": "m6i.2xlarge"}}
    admin.resources.get(api_version="v1", kind="Node").create(
        body={"metadata": node, "status": {"capacity": {"cpu": "8", "memory": "32Gi"}}}
    )

    def bind(kind, obj):
        if kind.kind == "Pod":
            obj["spec"]["nodeName"] = node["name"]

    api.admission.append(bind)
    dev_cluster.start_operator(DEVSERVERS_IDLE_CHECK_SECONDS="1")

    created = dev_cluster.devctl(
        "alice", "create", "box", "--flavor", FLAVOR, "--image", IMAGE,
        "--idle-timeout", "1h", "--keep-alive-process", Path(sys.executable).name,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    dev_cluster.wait(lambda: dev_cluster.status().get("phase") == "Running", "box Running")
    assert {"box", "box-ssh"} <= dev_cluster.names("services")
    assert "home-box-0" in dev_cluster.names("persistentvolumeclaims")
    # Who reaches its pods (tests/integration/test_network_isolation.py: what the policy allows).
    assert api.read("networkpolicies", "dev-alice", "box", group="networking.k8s.io")

    # Idle detection execs into the pod (a process namespace of its own) and records what it saw:
    # a process the owner named at create keeps the server running.
    dev_cluster.wait(lambda: dev_cluster.status().get("activeSessions") == 0, "an activity check")
    pod = api.read("pods", "dev-alice", "box-0")
    worker = api.runtime.run_in(pod, [sys.executable, "-c", "import time; time.sleep(300)"])
    servers.status.patch(
        name="box", namespace="dev-alice", body={"status": {"lastActivity": hours_ago(3)}},
        content_type="application/merge-patch+json",
    )  # fmt: skip
    dev_cluster.wait(
        lambda: dev_cluster.status().get("lastActivity", "") > hours_ago(1),
        "a process in the pod to count as activity",
    )
    assert not dev_cluster.server()["spec"].get("stopped")

    # devctl ssh: the pod's user through exec, then SSH through a port-forward of the API to
    # the pod's sshd (its entrypoint's, with the host key of the Secret the operator made).
    with OpenSsh() as site:
        serve_pod(site, dev_cluster, "box", 0)
        ssh = dev_cluster.devctl(
            "alice", "ssh", "box", "--", "-o", "BatchMode=yes", "echo", "hello-from-box"
        )
    assert ssh.returncode == 0, ssh.stderr
    assert "hello-from-box" in ssh.stdout
    listing = dev_cluster.devctl("alice", "list")
    assert listing.returncode == 0 and "Running" in listing.stdout, listing.stderr

    # A resized flavor reaches the server: its pods are replaced, its home kept.
    home = api.read("persistentvolumeclaims", "dev-alice", "home-box-0")["metadata"]["uid"]
    old = api.read("statefulsets", "dev-alice", "box", group="apps")["metadata"]["uid"]
    cpu = int(flavors.get(name=FLAVOR).spec.resources.limits.cpu) + 1
    amounts = {"cpu": str(cpu)}
    flavors.patch(
        name=FLAVOR, body={"spec": {"resources": {"requests": amounts, "limits": amounts}}},
        content_type="application/merge-patch+json",
    )  # fmt: skip

    def replaced():
        sts = api.read("statefulsets", "dev-alice", "box", group="apps")
        return (
            sts and sts["metadata"]["uid"] != old and dev_cluster.status().get("phase") == "Running"
        )

    dev_cluster.wait(replaced, "the StatefulSet replaced with the new flavor, Running")
    sts = api.read("statefulsets", "dev-alice", "box", group="apps")
    limits = sts["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["cpu"] == str(cpu)
    assert api.read("persistentvolumeclaims", "dev-alice", "home-box-0")["metadata"]["uid"] == home

    # Idle for longer than its timeout: stopped to zero, home kept; devctl start brings it back.
    worker.kill()
    worker.wait()
    dev_cluster.wait(
        lambda: dev_cluster.status().get("activeSessions") == 0, "a check of the new pod"
    )
    servers.status.patch(
        name="box", namespace="dev-alice", body={"status": {"lastActivity": hours_ago(3)}},
        content_type="application/merge-patch+json",
    )  # fmt: skip
    # First a warning (its message written to the pod's terminals through exec), never a stop.
    dev_cluster.wait(
        lambda: (
            [c["type"] for c in dev_cluster.status().get("conditions") or []] == ["IdleStopSoon"]
        ),
        "an idle-stop warning",
    )
    assert not dev_cluster.server()["spec"].get("stopped")
    # The ten minutes it gave have passed: the stop it promised is due.
    servers.status.patch(
        name="box", namespace="dev-alice", body={"status": {"idleStopAt": hours_ago(0.01)}},
        content_type="application/merge-patch+json",
    )  # fmt: skip
    dev_cluster.wait(lambda: dev_cluster.status().get("phase") == "Stopped", "an idle stop")
    assert (
        dev_cluster.status()["reason"] == "Idle" and dev_cluster.server()["spec"]["stopped"] is True
    )
    assert "box-0" not in dev_cluster.names("pods")
    assert "home-box-0" in dev_cluster.names("persistentvolumeclaims")
    # The stop is recorded (what it saves) and announced as an Event, under the operator's RBAC.
    usage = dev_cluster.status()["usage"]
    assert [(p["state"], p["instanceType"]) for p in usage][-2:] == [
        ("Running", "m6i.2xlarge"),
        ("IdleStopped", "m6i.2xlarge"),
    ]
    reasons = [e["reason"] for e in api.objects("events", "dev-alice")]
    assert "IdleStop" in reasons
    started = dev_cluster.devctl("alice", "start", "box")
    assert started.returncode == 0, started.stderr
    dev_cluster.wait(lambda: dev_cluster.status().get("phase") == "Running", "box Running again")
    assert "IdleRestart" in [e["reason"] for e in api.objects("events", "dev-alice")]
    # Its record is copied to the namespace's ledger; a server deleted while the operator runs
    # stays there, closed at its deletion (kopf's DELETED event, no finalizer).
    uid = dev_cluster.server()["metadata"]["uid"]
    copy = json.loads(
        api.read("configmaps", "dev-alice", f"{LEDGER_PREFIX}{uid}")["data"]["record"]
    )
    assert [p["state"] for p in copy["usage"]][-3:] == ["Running", "IdleStopped", "Running"]
    created = dev_cluster.devctl("alice", "create", "lab", "--flavor", FLAVOR, "--image", IMAGE)
    assert created.returncode == 0, created.stderr
    dev_cluster.wait(lambda: dev_cluster.status("lab").get("phase") == "Running", "lab Running")
    lab = dev_cluster.server("lab")["metadata"]["uid"]
    assert dev_cluster.devctl("alice", "delete", "lab").returncode == 0

    def closed() -> dict | None:
        found = api.read("configmaps", "dev-alice", f"{LEDGER_PREFIX}{lab}")
        entry = json.loads(found["data"]["record"]) if found else {}
        return entry if "deletedAt" in entry else None

    entry = dev_cluster.wait(closed, "lab's record closed in the ledger")
    assert entry["usage"][-1]["end"] == entry["deletedAt"]
    assert api.refusals == []

    # With the operator down (as during `pulumi destroy`), deletion completes: no finalizer.
    dev_cluster.stop_operator()
    deleted = dev_cluster.devctl("alice", "delete", "box")
    assert deleted.returncode == 0, deleted.stderr
    dev_cluster.wait(lambda: dev_cluster.server() is None, "box deleted with the operator stopped")
    dev_cluster.wait(
        lambda: not dev_cluster.names("statefulsets", group="apps"), "children collected"
    )
    admin.resources.get(api_version="v1", kind="Namespace").delete(name="dev-alice")
    dev_cluster.wait(lambda: api.read("namespaces", "", "dev-alice") is None, "dev-alice deleted")
    assert api.refusals == []
