"""Every command that talks to the cluster ends in one line, with no traceback, when the API
server its kubeconfig names cannot be reached: a port nothing listens on, a name that does not
resolve (RFC 6761's `.invalid`). Each runs as a user runs it, in a process of its own."""

import subprocess
import sys

import pytest
import yaml

from tests.devservers_cluster import free_port
from tests.plugin import ROOT

DIGEST = "sha256:" + "0" * 64
IMAGE = f"123456789012.dkr.ecr.us-west-2.amazonaws.com/tp-dev/trainer@{DIGEST}"
# Each command that needs the cluster, with arguments that get it as far as its first API call.
COMMANDS = {
    "deploy.roll": ["-m", "deploy.roll", "--stack", "dev", "--pool", "gpu-large"],
    "deploy.released_homes": ["-m", "deploy.released_homes"],
    "gpuwatch.watcher": [
        "-m", "gpuwatch.watcher", "--pools", "gpu-small", "--node-selector", "gpu=true",
        "--timeout-seconds", "600", "--max-deletions", "1",
    ],
    "usagerecorder.recorder": [
        "-m", "usagerecorder.recorder", "--record-namespace", "usage-records",
        "--namespaces", "team-a", "--pool-label", "pool", "--job-pods", "PyTorchJob=a={name}",
        "--keep-days", "35",
    ],
    "devctl": ["-m", "devservers.cli", "list", "-n", "dev-alice"],
    "trainer.fetch": [
        "-m", "trainer.fetch", "/efs/checkpoints/job", "--namespace", "team-a", "--image", IMAGE,
    ],
    "workloads.nccl_check": [
        "-m", "workloads.nccl_check", "--pool", "gpu-large", "--queue", "research",
        "--image", IMAGE,
    ],
}  # fmt: skip


def kubeconfig(server: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }


@pytest.mark.parametrize("where", ["closed port", "unresolvable name"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unreachable_api_server_is_one_line(command, where, tmp_path):
    server = {
        "closed port": f"https://127.0.0.1:{free_port()}",
        "unresolvable name": "https://nonexistent.invalid:6443",
    }[where]
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig(server)))
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "KUBECONFIG": str(tmp_path / "kubeconfig"),
    }
    done = subprocess.run(
        [sys.executable, *COMMANDS[command]], cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "cannot reach" in done.stderr and server.split("//")[1].split(":")[0] in done.stderr
