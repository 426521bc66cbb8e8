"""devctl: dry-run output is a DevServer the CRD accepts; errors are one clear line; commands
drive the server through the API (an in-memory one here)."""

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devservers.api import API_VERSION
from devservers.cli import main
from devservers.fake_cluster import FakeCluster
from tests.crd_schema import cel_violations, conformance_errors
from tests.test_devservers_crds import gpu_flavor

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOr4 alice@laptop"


@pytest.fixture
def key_file(tmp_path) -> Path:
    path = tmp_path / "id_ed25519.pub"
    path.write_text(KEY + "\n")
    return path


def devctl(*argv, cluster=None) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), cluster=cluster, out=out)
    return code, out.getvalue()


CREATE = ["create", "box", "--flavor", "gpu-1", "-n", "dev-alice", "--image", "repo/dev:1"]


@pytest.mark.parametrize("output", ["yaml", "json"])
def test_dry_run_prints_a_devserver_the_crd_accepts(key_file, output):
    argv = [*CREATE, "--distributed", "--replicas", "4", "--ssh-key", str(key_file)]
    code, text = devctl(*argv, "--idle-timeout", "45m", "--dry-run", "-o", output)
    assert code == 0
    manifest = yaml.safe_load(text) if output == "yaml" else json.loads(text)
    assert conformance_errors(manifest) == [] and cel_violations(manifest) == []
    spec = manifest["spec"]
    assert spec["owner"] == "alice" and spec["distributed"]["worldSize"] == 4
    assert spec["ssh"]["authorizedKeys"] == [KEY]
    assert spec["lifecycle"]["idleTimeout"] == "45m"


def test_the_console_script_is_installed_and_runs(key_file):
    script = shutil.which("devctl") or str(Path(sys.executable).parent / "devctl")
    result = subprocess.run(
        [script, *CREATE, "--ssh-key", str(key_file), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["kind"] == "DevServer"


def cluster_with_quota(servers_used="0", gpus_used="0") -> FakeCluster:
    cluster = FakeCluster()
    cluster.create(gpu_flavor())
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "devservers", "namespace": "dev-alice"},
            "spec": {
                "hard": {
                    "count/devservers.dev.training-platform.io": "2",
                    "requests.nvidia.com/gpu": "4",
                }
            },
            "status": {
                "used": {
                    "count/devservers.dev.training-platform.io": servers_used,
                    "requests.nvidia.com/gpu": gpus_used,
                }
            },
        }
    )
    return cluster


def test_create_submits_the_server(key_file):
    cluster = cluster_with_quota()
    code, text = devctl(*CREATE, "--ssh-key", str(key_file), cluster=cluster)
    assert code == 0 and "devserver/box created" in text
    assert cluster.get(API_VERSION, "DevServer", "box", "dev-alice")["spec"]["flavor"] == "gpu-1"


@pytest.mark.parametrize(
    ("argv", "cluster", "message"),
    [
        (["--flavor", "gpu-9"], cluster_with_quota, "unknown flavor 'gpu-9'; available: gpu-1"),
        ([], lambda: cluster_with_quota(servers_used="2"), "over quota: 2 of 2 servers in use"),
        (
            ["--distributed", "--replicas", "4"],
            lambda: cluster_with_quota(gpus_used="1"),
            "over quota: 1 of 4 GPUs in use, this server needs 4 more",
        ),
    ],
)
def test_create_explains_what_is_wrong(key_file, capsys, argv, cluster, message):
    code, _ = devctl(*CREATE, "--ssh-key", str(key_file), *argv, cluster=cluster())
    assert code == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_someone_elses_namespace_is_refused_clearly(key_file, capsys):
    cluster = cluster_with_quota()
    cluster.forbidden.add("dev-bob")
    code, _ = devctl("list", "-n", "dev-bob", cluster=cluster)
    assert code == 1
    assert "not allowed to list DevServers in namespace dev-bob" in capsys.readouterr().err
    code, _ = devctl(*CREATE[:-4], "-n", "team-a", "--image", "x", "--dry-run")
    assert code == 1
    assert "not a user namespace; allowed: dev-<user>" in capsys.readouterr().err


def running_cluster(key_file) -> FakeCluster:
    cluster = cluster_with_quota()
    devctl(*CREATE, "--distributed", "--replicas", "2", "--ssh-key", str(key_file), cluster=cluster)
    cluster.patch_status(
        "box",
        "dev-alice",
        {"phase": "Running", "replicas": 2, "replicasReady": 2, "gpuUtilization": 42.0},
    )
    return cluster


def test_list_stop_start_monitor_and_delete(key_file, capsys):
    cluster = running_cluster(key_file)
    _, listing = devctl("list", "-n", "dev-alice", cluster=cluster)
    assert "box" in listing and "Running" in listing and "2/2" in listing
    _, monitor = devctl("monitor", "box", "-n", "dev-alice", cluster=cluster)
    assert "GPU utilization: 42%" in monitor and "pods ready:      2/2" in monitor
    devctl("stop", "box", "-n", "dev-alice", cluster=cluster)
    assert cluster.get(API_VERSION, "DevServer", "box", "dev-alice")["spec"]["stopped"] is True
    devctl("start", "box", "-n", "dev-alice", cluster=cluster)
    assert cluster.get(API_VERSION, "DevServer", "box", "dev-alice")["spec"]["stopped"] is False
    code, _ = devctl("monitor", "nobox", "-n", "dev-alice", cluster=cluster)
    assert code == 1 and "no DevServer 'nobox' in dev-alice" in capsys.readouterr().err
    _, deleted = devctl("delete", "box", "-n", "dev-alice", cluster=cluster)
    assert "devserver/box deleted" in deleted


def test_run_copies_the_script_to_every_pod_and_torchruns_it_there(key_file, tmp_path):
    cluster = running_cluster(key_file)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    code, text = devctl(
        # devctl's own options come before the server: everything after the script is its own
        "run",
        "-n",
        "dev-alice",
        "--dry-run",
        "box",
        str(script),
        "--steps",
        "10",
        cluster=cluster,
    )
    assert code == 0
    lines = text.splitlines()
    assert f"kubectl -n dev-alice cp -c dev {script} box-1:/home/dev/.devctl/train.py" in lines
    launches = [line for line in lines if "torchrun.sh" in line]
    assert launches == [
        f"kubectl -n dev-alice exec box-{i} -c dev -- "
        "/etc/devserver/torchrun.sh /home/dev/.devctl/train.py --steps 10"
        for i in range(2)
    ]


def test_run_on_a_stopped_server_says_how_to_start_it(key_file, tmp_path, capsys):
    cluster = running_cluster(key_file)
    devctl("stop", "box", "-n", "dev-alice", cluster=cluster)
    script = tmp_path / "train.py"
    script.write_text("")
    code, _ = devctl("run", "-n", "dev-alice", "box", str(script), cluster=cluster)
    assert code == 1 and "`devctl start box`" in capsys.readouterr().err


def test_ssh_port_forwards_to_the_replica_and_logs_in_as_the_pods_user(
    key_file, tmp_path, monkeypatch
):
    """kubectl and ssh replaced by scripts that record their arguments (the fake kubectl also
    listens on the forwarded port, as port-forward does)."""
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(
        f'#!/bin/sh\necho "kubectl $*" >> {calls}\n'
        f'exec {sys.executable} -c "import socket, sys, time\n'
        "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1].split(':')[0]))); s.listen()\n"
        'time.sleep(30)" "$5"\n'
    )
    (bin_dir / "ssh").write_text(f'#!/bin/sh\necho "ssh $*" >> {calls}\n')
    for tool in ("kubectl", "ssh"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    cluster = running_cluster(key_file)
    cluster.outputs["id -un"] = "trainer\n"
    code, _ = devctl(
        "ssh",
        "-n",
        "dev-alice",
        "box",
        "--replica",
        "1",
        "--",
        "-L",
        "8888:localhost:8888",
        cluster=cluster,
    )
    assert code == 0
    kubectl, ssh = calls.read_text().splitlines()
    port = kubectl.split()[-1].split(":")[0]
    assert kubectl == f"kubectl -n dev-alice port-forward pod/box-1 {port}:2222"
    assert ssh.startswith(f"ssh -p {port} ")
    assert ssh.endswith("trainer@127.0.0.1 -L 8888:localhost:8888")
    code, _ = devctl("ssh", "-n", "dev-alice", "box", "--replica", "2", cluster=cluster)
    assert code == 1
