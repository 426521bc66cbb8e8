"""The DevServers of the dev stack on the local Kubernetes API (tests.kube_api): the operator run
as its image runs it (the Dockerfile's ENTRYPOINT with the plan's Deployment args, env and
ServiceAccount), devctl run as a user runs it (the `devctl` module with a kubeconfig of the
user's EKS access entry), and an administrator's client for what the platform team does."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml
from kubernetes import config, dynamic

from devservers.api import API_VERSION, user_namespace
from devservers.tests.test_devservers_render import IMAGE
from infra.kueue.tests.kueue_rules import workload_crd
from tests.kube_api import ADMIN, from_plan, service_account, user
from tests.openssh import account as image_user
from tests.plugin import ROOT

DEPLOYMENT = "dev-servers-operator"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, what: str, timeout: float = 60):
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout`, which
    is for a hang (the operator and its pods start in seconds, in tens of them under load)."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


class Cluster:
    def __init__(self, plan, tmp_path: Path):
        self.plan, self.dir = plan, tmp_path
        # The Workloads the stack's Kueue chart serves (its CRD is not in the plan); the pods run
        # as the non-root user the images' sshd runs as in tests.openssh.
        self.api = from_plan(plan, crds=[workload_crd()], account=image_user())
        self.operator: subprocess.Popen | None = None
        self.operator_log = tmp_path / "operator.log"
        deployment = plan.one("kubernetes:apps/v1:Deployment", DEPLOYMENT).inputs
        pod = deployment["spec"]["template"]["spec"]
        (self.container,) = pod["containers"]
        self.operator_env = {e["name"]: e["value"] for e in self.container["env"]}
        account = service_account(deployment["metadata"]["namespace"], pod["serviceAccountName"])
        self.kubeconfigs = {"operator": self._kubeconfig("operator", account)}
        self.kubeconfigs["admin"] = self._kubeconfig("admin", ADMIN)
        # Users as EKS maps them: the access entry's principal, in its kubernetesGroups.
        for entry in plan.of_type("aws:eks/accessEntry:AccessEntry"):
            if entry.name.startswith("dev-servers-access-"):
                name = entry.name.removeprefix("dev-servers-access-")
                who = user(entry.inputs["principalArn"], entry.inputs["kubernetesGroups"])
                self.kubeconfigs[name] = self._kubeconfig(name, who, user_namespace(name))
        self.home = tmp_path / "home"
        (self.home / ".ssh").mkdir(parents=True)
        self.key = self.home / ".ssh" / "id_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "alice@laptop", "-f", self.key],
            check=True,
        )

    def _kubeconfig(self, name: str, who, namespace: str | None = None) -> Path:
        path = self.dir / f"kubeconfig-{name}"
        path.write_text(yaml.safe_dump(self.api.kubeconfig(self.api.add_token(who), namespace)))
        return path

    def client(self, who: str = "admin") -> dynamic.DynamicClient:
        return dynamic.DynamicClient(config.new_client_from_config(str(self.kubeconfigs[who])))

    def wait(self, check, what: str, timeout: float = 60):
        """wait_for, failing with what the API refused and what the operator logged."""
        try:
            return wait_for(check, what, timeout)
        except AssertionError as e:
            raise AssertionError(
                f"{e}\nrefused by RBAC: {sorted(set(self.api.refusals))}\noperator log:\n"
                f"{self.log_tail()}"
            ) from None

    def close(self) -> None:
        self.stop_operator()
        self.api.stop()

    # the operator

    def operator_command(self, liveness_port: int) -> list[str]:
        dockerfile = (ROOT / "devservers" / "Dockerfile").read_text()
        entrypoint = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M).group(1))
        assert entrypoint[0] == "kopf"
        args = [
            f"--liveness=http://127.0.0.1:{liveness_port}/healthz"
            if a.startswith("--liveness=")
            else a
            for a in self.container["args"]
        ]
        return [sys.executable, "-m", "kopf", *entrypoint[1:], *args]

    def start_operator(self, **env: str) -> None:
        port = free_port()
        environment = {
            **os.environ,
            **self.operator_env,
            "KUBECONFIG": str(self.kubeconfigs["operator"]),
            "PYTHONPATH": str(ROOT),
            "TMPDIR": str(self.dir),  # the kubernetes client's discovery cache
            # Not the Deployment's fixed port: another test's operator may be running.
            "DEVSERVERS_METRICS_PORT": str(free_port()),
            **env,
        }
        environment.pop("KUBERNETES_SERVICE_HOST", None)
        log = self.operator_log.open("a")
        self.operator = subprocess.Popen(
            self.operator_command(port),
            cwd=ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def healthy() -> bool:
            assert self.operator.poll() is None, f"the operator exited:\n{self.log_tail()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(healthy, "the operator's liveness endpoint", timeout=60)

    def stop_operator(self) -> None:
        if self.operator is None or self.operator.poll() is not None:
            return
        os.killpg(self.operator.pid, signal.SIGTERM)
        try:
            self.operator.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.operator.pid, signal.SIGKILL)
            self.operator.wait()

    def log_tail(self, lines: int = 40) -> str:
        if not self.operator_log.exists():
            return "(not started)"
        return "\n".join(self.operator_log.read_text().splitlines()[-lines:])

    # devctl

    def devctl_env(self, who: str) -> dict[str, str]:
        """The environment devctl runs in as `who`."""
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfigs[who]),
            "HOME": str(self.home),
            "PYTHONPATH": str(ROOT),
            "TMPDIR": str(self.dir),
        }

    def devctl(self, who: str, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "devservers.cli", *argv],
            cwd=ROOT,
            env=self.devctl_env(who) | (env or {}),
            capture_output=True,
            text=True,
            timeout=120,
        )

    def create_server(self, *flags: str, name: str = "box") -> dict:
        """`devctl create` of a cpu-small server as alice, with `flags`; its status once it runs
        (the operator must be up)."""
        created = self.devctl(
            "alice", "create", name, "--flavor", "cpu-small", "--image", IMAGE, *flags
        )
        assert created.returncode == 0, created.stderr
        self.wait(lambda: self.status(name).get("phase") == "Running", f"{name} Running", 60)
        return self.status(name)

    # reading the cluster

    def server(self, name: str = "box", namespace: str = "dev-alice") -> dict | None:
        group = API_VERSION.split("/")[0]
        return self.api.read("devservers", namespace, name, group=group)

    def status(self, name: str = "box", namespace: str = "dev-alice") -> dict:
        return (self.server(name, namespace) or {}).get("status") or {}

    def names(self, plural: str, namespace: str = "dev-alice", group: str = "") -> set[str]:
        return {o["metadata"]["name"] for o in self.api.objects(plural, namespace, group)}
