"""devctl: dry-run output is a DevServer the CRD accepts; its commands drive servers through the
local Kubernetes API (tests.kube_api) with a user's kubeconfig and the dev stack's RBAC; every
error (RBAC, validation, quota, no kubeconfig, no API server) is one clear line."""

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devservers.api import API_VERSION, GPU_REQUESTS, QUOTA, SERVER_COUNT
from devservers.cli import main
from infra.core.tests.crd_schema import cel_violations, conformance_errors
from tests.devservers_cluster import Cluster, free_port
from tests.plugin import ROOT
from workloads.image import trainer_tag

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOr4 alice@laptop"


@pytest.fixture
def key_file(tmp_path) -> Path:
    path = tmp_path / "id_ed25519.pub"
    path.write_text(KEY + "\n")
    return path


def devctl(*argv) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
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


@pytest.fixture
def cluster(dev_cluster, monkeypatch):
    """The dev stack's API; devctl runs as alice (her kubeconfig, namespace dev-alice)."""
    monkeypatch.setenv("KUBECONFIG", str(dev_cluster.kubeconfigs["alice"]))
    return dev_cluster


def admin_status(cluster: Cluster, kind: str, name: str, status: dict) -> None:
    """Write a status as its controller (the operator, the quota controller) would."""
    api_version = API_VERSION if kind == "DevServer" else "v1"
    resource = cluster.client().resources.get(api_version=api_version, kind=kind)
    resource.status.patch(
        name=name, namespace="dev-alice", body={"status": status},
        content_type="application/merge-patch+json",
    )  # fmt: skip


def errors(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_create_submits_the_server(cluster, key_file):
    code, text = devctl(*CREATE, "--ssh-key", str(key_file))
    assert code == 0 and "devserver/box created" in text
    assert cluster.server()["spec"]["flavor"] == "gpu-1"
    assert cluster.server()["spec"]["lifecycle"]["idleTimeout"] == "2h"


@pytest.mark.parametrize(
    ("argv", "used", "message"),
    [
        (["--flavor", "gpu-9"], {}, "unknown flavor 'gpu-9'; available: a100-8, cpu-small, gpu-1"),
        ([], {SERVER_COUNT: "3"}, "over quota: 3 of 3 servers in use"),
        (
            ["--distributed", "--replicas", "4"],
            {GPU_REQUESTS: "5"},
            "over quota: 5 of 8 GPUs in use, this server needs 4 more",
        ),
        (["--idle-timeout", "90s"], {}, "spec.lifecycle.idleTimeout: '90s' does not match"),
    ],
)
def test_create_explains_what_is_wrong(cluster, key_file, capsys, argv, used, message):
    if used:
        admin_status(cluster, "ResourceQuota", QUOTA, {"used": used})
    code, _ = devctl(*CREATE, "--ssh-key", str(key_file), *argv)
    assert code == 1
    assert message in errors(capsys)
    assert cluster.server() is None


def test_someone_elses_namespace_is_refused_clearly(cluster, key_file, capsys):
    code, _ = devctl("list", "-n", "dev-bob")
    assert code == 1
    assert (
        "not allowed to list DevServers in namespace dev-bob (devservers.dev.training-platform.io "
        'is forbidden: User "arn:aws:iam::123456789012:role/dev-alice" cannot list resource'
    ) in errors(capsys)
    code, _ = devctl(*CREATE[:-4], "-n", "team-a", "--ssh-key", str(key_file), "--dry-run")
    assert code == 1
    assert "not a user namespace; allowed: dev-<user>" in errors(capsys)


def running(cluster: Cluster, key_file, *extra) -> None:
    """Server box created by devctl, with its pods running and the status an operator gives it
    (no operator runs here)."""
    assert devctl(*CREATE, "--ssh-key", str(key_file), *extra)[0] == 0
    replicas = 2 if "--distributed" in extra else 1
    pods = cluster.client().resources.get(api_version="v1", kind="Pod")
    for index in range(replicas):
        container = {"name": "dev", "image": "repo/dev:1"}
        pod = {"metadata": {"name": f"box-{index}"}, "spec": {"containers": [container]}}
        pods.create(body=pod, namespace="dev-alice")
    cluster.api.settle()  # the kubelet runs them
    status = {"phase": "Running", "replicas": replicas, "replicasReady": replicas}
    admin_status(cluster, "DevServer", "box", status | {"gpuUtilization": 42.0})


def test_list_stop_start_monitor_and_delete(cluster, key_file, capsys):
    running(cluster, key_file, "--distributed", "--replicas", "2")
    _, listing = devctl("list")
    assert "box" in listing and "Running" in listing and "2/2" in listing
    _, monitor = devctl("monitor", "box")
    assert "GPU utilization: 42%" in monitor and "pods ready:      2/2" in monitor
    devctl("stop", "box")
    assert cluster.server()["spec"]["stopped"] is True
    devctl("start", "box")
    assert cluster.server()["spec"]["stopped"] is False
    code, _ = devctl("monitor", "nobox")
    assert code == 1 and "no DevServer 'nobox' in dev-alice" in errors(capsys)
    _, deleted = devctl("delete", "box")
    assert "devserver/box deleted" in deleted
    cluster.api.settle()  # the garbage collector ends the foreground deletion
    assert cluster.server() is None
    assert cluster.api.refusals == []


def project(root: Path, files: dict[str, int]) -> Path:
    """A working directory with `files` (relative path: size in bytes)."""
    for relative, size in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(b"x" * size)
    return root


def test_run_dry_run_shows_what_is_synced_and_what_each_pod_runs(cluster, key_file, tmp_path):
    running(cluster, key_file, "--distributed", "--replicas", "2")
    files = {"train.py": 10, "lib/model.py": 20, "data/big.bin": 30}
    left_out = {".git/HEAD": 1, "lib/__pycache__/model.pyc": 1, ".venv/bin/python": 1}
    root = project(tmp_path / "project", files | left_out)
    # devctl's own options come before the server: everything after the script is its own
    code, text = devctl(
        "run", "--dry-run", "--exclude", "data", "box", str(root / "train.py"), "--steps", "10"
    )
    assert code == 0
    lines = text.splitlines()
    assert lines[:3] == ["lib", "lib/model.py", "train.py"]  # a directory before what it holds
    assert lines[3] == (
        f"would sync 2 files, 0.0 MiB from {root} to ~/devctl/project on box-0, box-1"
    )
    assert lines[4:] == [
        f"box-{i}: cd ~/devctl/project && /etc/devserver/torchrun.sh train.py --steps 10"
        for i in range(2)
    ]


def test_run_refuses_a_working_directory_over_its_size_guard(cluster, key_file, tmp_path, capsys):
    running(cluster, key_file)
    root = project(tmp_path / "project", {"train.py": 10, "ckpt/a.pt": 2 << 20, "src/x.py": 20})
    code, _ = devctl("run", "--max-size", "1", "box", str(root / "train.py"))
    assert code == 1
    assert (
        f"--workdir {root}: 2.0 MiB in 3 files, over the 1 MiB limit; largest: ckpt/ 2.0 MiB, "
        "src/ 0.0 MiB, train.py 0.0 MiB. Leave parts out with --exclude NAME, or raise --max-size"
    ) in errors(capsys)
    code, _ = devctl(
        "run", "--max-size", "1", "--exclude", "ckpt", "--dry-run", "box", str(root / "train.py")
    )
    assert code == 0
    code, _ = devctl("run", "--workdir", str(root / "src"), "box", str(root / "train.py"))
    assert code == 1 and "is not inside the working directory" in errors(capsys)


def test_run_on_a_stopped_server_says_how_to_start_it(cluster, key_file, tmp_path, capsys):
    running(cluster, key_file)
    devctl("stop", "box")
    script = tmp_path / "train.py"
    script.write_text("")
    code, _ = devctl("run", "box", str(script))
    assert code == 1 and "`devctl start box`" in errors(capsys)


def test_ssh_to_a_replica_that_does_not_exist_is_refused(cluster, key_file, capsys):
    running(cluster, key_file)
    code, _ = devctl("ssh", "box", "--replica", "1")
    assert code == 1 and "--replica 1; allowed: 0 to 0" in errors(capsys)


def test_ssh_without_exec_rights_says_so_in_one_line(cluster, key_file, capsys, monkeypatch):
    """A reader of dev-alice (a role the stack does not have) may see the server and its pods,
    not enter."""
    running(cluster, key_file)
    servers = {"apiGroups": [API_VERSION.split("/")[0]], "resources": ["devservers"]}
    pods = {"apiGroups": [""], "resources": ["pods"]}
    cluster.api.authorizer.manifests += [
        {
            "kind": "Role",
            "metadata": {"name": "reader", "namespace": "dev-alice"},
            "rules": [servers | {"verbs": ["get"]}, pods | {"verbs": ["get"]}],
        },
        {
            "kind": "RoleBinding",
            "metadata": {"name": "reader", "namespace": "dev-alice"},
            "roleRef": {"kind": "Role", "name": "reader"},
            "subjects": [{"kind": "User", "name": "carol"}],
        },
    ]
    from tests.kube_api import user

    path = cluster.dir / "kubeconfig-carol"
    token = cluster.api.add_token(user("carol"))
    path.write_text(yaml.safe_dump(cluster.api.kubeconfig(token, "dev-alice")))
    monkeypatch.setenv("KUBECONFIG", str(path))
    code, _ = devctl("ssh", "box")
    assert code == 1
    assert (
        'not allowed to exec into and port-forward to pods in namespace dev-alice (pods "box-0" '
        'is forbidden: User "carol" cannot get resource "pods/exec"'
    ) in errors(capsys)


def test_without_a_kubeconfig_or_an_api_server_devctl_says_which(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert devctl("list", "-n", "dev-alice")[0] == 1
    assert f"no kubeconfig at {tmp_path / 'missing'}" in errors(capsys)
    unreachable = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(unreachable))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    assert devctl("list", "-n", "dev-alice")[0] == 1
    assert "cannot reach the Kubernetes API server at http://127.0.0.1:" in errors(capsys)


def offline_commands() -> list[str]:
    """The devctl dry runs of the docs' offline examples (tests/e2e/test_docs_examples.py runs them
    and compares what they print; this checks what they print is a DevServer the CRD accepts)."""
    sys.path.insert(0, str(ROOT / "docs/_ext"))
    from commands import parse_blocks

    page = ROOT / "docs/users/devservers.md"
    return [
        command.line
        for block in parse_blocks(page, page.read_text())
        if block.kind == "offline"
        for command in block.commands
        if "devctl create" in command.line and "--dry-run" in command.line
    ]


def test_the_docs_offline_dry_runs_print_what_the_crd_accepts(tmp_path):
    """devctl from the checkout's .venv with no kubeconfig and an empty HOME: every command
    prints a DevServer the CRD accepts, with the stack's defaults, and writes nothing."""
    commands = offline_commands()
    assert any(
        c.startswith("USER=alice .venv/bin/devctl create box --flavor gpu-1") for c in commands
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),  # this checkout, not the one the console script was installed from
    }
    for command in commands:
        result = subprocess.run(
            ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, f"{command}: {result.stderr}"
        manifest = yaml.safe_load(result.stdout)  # JSON is YAML too
        assert conformance_errors(manifest) == [] and cel_violations(manifest) == [], command
        assert "devctl: dry run with Pulumi." in result.stderr, command
    assert list(tmp_path.iterdir()) == []  # nothing written (no kubeconfig, no cache)


def test_a_dry_run_takes_namespace_image_and_flavors_from_the_stack(monkeypatch, capsys):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.delenv("DEVCTL_IMAGE", raising=False)
    monkeypatch.setenv("USER", "bob")
    code, text = devctl("create", "box", "--flavor", "gpu-4", "--dry-run")
    assert code == 0
    manifest = yaml.safe_load(text)
    assert manifest["metadata"]["namespace"] == "dev-bob" and manifest["spec"]["owner"] == "bob"
    runtime = trainer_tag("runtime")
    assert manifest["spec"]["image"] == (
        f"<account>.dkr.ecr.us-west-2.amazonaws.com/tp-dev/trainer:{runtime}"
    )
    assert "put your AWS account in place of <account>" in capsys.readouterr().err
    code, text = devctl("create", "box", "--flavor", "a100-8", "--stack", "prod", "--user", "carol",
                        "--dry-run", "--image", "repo/dev:1")  # fmt: skip
    assert code == 0 and yaml.safe_load(text)["metadata"]["namespace"] == "dev-carol"


@pytest.mark.parametrize(
    ("argv", "user", "message"),
    [
        (
            [],
            "root",
            "$USER 'root' is not a DevServers user; allowed: alice, bob (Pulumi.dev.yaml)",
        ),
        (
            ["--user", "alise"],
            "root",
            "--user 'alise' is not a DevServers user; did you mean 'alice'?",
        ),
        (
            ["--flavor", "gpu1"],
            "alice",
            "unknown flavor 'gpu1'; did you mean 'gpu-1'? allowed: cpu-small",
        ),
        (
            ["--stack", "staging"],
            "alice",
            "No stack file Pulumi.staging.yaml; allowed stacks: dev, prod",
        ),
    ],
)
def test_a_dry_run_says_what_the_stack_does_not_have(monkeypatch, capsys, argv, user, message):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.setenv("USER", user)
    flavor = [] if "--flavor" in argv else ["--flavor", "gpu-1"]
    code, _ = devctl("create", "box", *flavor, *argv, "--image", "repo/dev:1", "--dry-run")
    assert code == 1
    assert message in errors(capsys)


def test_ctrl_c_anywhere_ends_devctl_in_one_line(monkeypatch, capsys):
    """Ctrl-C while devctl waits (monitor --watch, a sync, the API): exit 130, no traceback."""

    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr("devservers.cli.resolve_namespace", interrupted)
    assert main(["monitor", "box", "--watch", "5"]) == 130
    assert capsys.readouterr().err == "devctl: interrupted\n"
