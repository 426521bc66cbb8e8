"""Your own code: `devctl submit` of a folder the platform did not write (examples/your-own-code,
a CNN with its own checkpoints), rendered as the platform's jobs, and run here through the same
trainer.user_code the pods run: real torchrun, real pip over a local package index, real
TensorBoard event files."""

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from devservers import cli
from infra.core.tests.admission_rules import refusals
from infra.core.tests.crd_schema import cel_violations, conformance_errors
from tests.kube_api import admission_policies
from tests.plugin import ROOT
from tests.team_cluster import EXAMPLE, user_project
from tests.tensorboard_view import series, tensorboard
from workloads.manifests import QUEUE_LABEL

DEVCTL = [sys.executable, "-m", "devservers.cli"]
MEMBER = {
    "username": "arn:aws:iam::123456789012:role/dev-alice",
    "groups": ("team:team-a", "system:authenticated"),
}


def devctl(*args: str, cwd: Path = ROOT, env: dict | None = None, **popen):
    return subprocess.run(
        [*DEVCTL, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
        **popen,
    )


def dry_run(*args: str) -> subprocess.CompletedProcess:
    """devctl's main in this process (a dry run starts nothing), as its command line runs it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["submit", "--dry-run", *args], out=out)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def rendered(*args: str) -> dict:
    done = dry_run("-f", str(EXAMPLE / "task.yaml"), "-n", "team-a", *args)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


# -- the job it renders ----------------------------------------------------------------------


@pytest.mark.parametrize("nodes,kind", [("2", "TrainJob"), ("2:4", "PyTorchJob")])
def test_a_folder_becomes_the_platforms_job_that_the_crds_and_policies_admit(dev_plan, nodes, kind):
    done = dry_run("-f", str(EXAMPLE / "task.yaml"), "-n", "team-a", "--nodes", nodes, "--name",
                   "cnn")  # fmt: skip
    job = yaml.safe_load(done.stdout)
    assert job["kind"] == kind
    # The retired training operator is named exactly when the job is elastic: a PyTorchJob.
    warned = "warning: job cnn is an elastic PyTorchJob" in done.stderr
    assert warned == (kind == "PyTorchJob"), done.stderr
    assert "training operator v1.9.4" in done.stderr or not warned
    assert job["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert conformance_errors(job) == [] and cel_violations(job) == []
    assert policy_refusals(dev_plan, job, **MEMBER) == {}


def policy_refusals(plan, job: dict, **request) -> dict[str, list[str]]:
    """{policy: its messages} for each of the plan's admission policies that refuses creating
    `job` in team-a by `request`'s user."""
    namespace = next(
        n.inputs
        for n in plan.of_type("kubernetes:core/v1:Namespace")
        if n.inputs["metadata"]["name"] == "team-a"
    )
    found = {
        name: refusals(policy, "CREATE", job, namespace=namespace, **request)
        for name, policy in admission_policies(plan).items()
    }
    return {name: messages for name, messages in found.items() if messages}


def test_the_pods_run_the_snapshot_of_the_folder_through_trainer_user_code():
    job = rendered("--name", "cnn")
    command = job["spec"]["trainer"]["command"]
    assert command[:3] == ["python", "-m", "trainer.user_code"]
    code = command[command.index("--code") + 1]
    from mesh.workdir import DEFAULT_EXCLUDES, pack
    from trainer.user_code import digest

    assert code == digest(pack(EXAMPLE, DEFAULT_EXCLUDES, 100).data)
    assert command[command.index("--checkpoint-dir") + 1] == "/efs/checkpoints/cnn"
    assert command[command.index("--") + 1 :] == ["train.py", "--epochs", "4"]
    assert job["spec"]["trainer"]["numNodes"] == 2


def test_an_elastic_job_fails_on_input_no_restart_fixes_and_restarts_on_a_kill():
    job = rendered("--nodes", "1:3", "--name", "cnn")
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert worker["restartPolicy"] == "ExitCode"
    assert job["spec"]["elasticPolicy"] == {
        "rdzvBackend": "c10d",
        "minReplicas": 1,
        "maxReplicas": 3,
        "maxRestarts": 3,
    }
    pod = worker["template"]
    assert pod["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert pod["spec"]["serviceAccountName"] == "self-service-jobs"
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert {"/dev/shm", "/efs"} <= mounts


@pytest.mark.parametrize(
    "args,said",
    [
        (["--pool", "gpu-smal"], "no pool 'gpu-smal'; did you mean 'gpu-small'?"),
        (["--nodes", "5"], "nodes 5: pool gpu-small has at most 4 nodes"),
        (["--nodes", "3:2"], "nodes: '3:2': allowed: 1 <= MIN <= MAX"),
        (["--queue", "Team"], "queue: String should match pattern"),
        (["--", "missing.py"], "no script 'missing.py'"),
        (["--requirements", "nope.txt"], "no requirements file 'nope.txt'"),
        (["--max-size", "0"], "maxSizeMb: Input should be greater than or equal to 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_anything_is_made(args, said, tmp_path):
    done = dry_run("-f", str(EXAMPLE / "task.yaml"), "-n", "team-a", *args)
    assert done.returncode == 2, done.stdout
    assert said in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_a_task_file_names_each_bad_key(tmp_path):
    task = tmp_path / "task.yaml"
    task.write_text("pool: gpu-small\nrun: [train.py]\nnode: 2\nimage: 3\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    done = dry_run("-f", str(task), "-n", "team-a")
    assert done.returncode == 2
    assert "node: unknown key; did you mean 'nodes'?" in done.stderr
    assert "image: Input should be a valid string" in done.stderr


def test_a_folder_over_the_cap_is_refused_naming_what_is_big(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "data.bin").write_bytes(os.urandom(2 * 1024 * 1024))
    done = devctl(
        "submit", "--pool", "cpu", "--max-size", "1", "--dry-run", "-n", "team-a", "--",
        "train.py", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert "over the 1 MiB limit; largest: data.bin 2.0 MiB" in done.stderr


# -- the same command here ---------------------------------------------------------------------


@pytest.fixture
def project(tmp_path):
    return user_project(tmp_path)


def local(project, *args: str, **popen):
    folder, store, env = project
    command = ["submit", "-f", "task.yaml", "--local", "--store", str(store), "--name", "cnn"]
    return devctl(*command, *args, cwd=folder, env=env, **popen)


def test_locally_it_installs_once_stops_on_sigterm_with_a_checkpoint_and_resumes(project, tmp_path):
    folder, store, env = project
    first = subprocess.Popen(
        [*DEVCTL, "submit", "-f", "task.yaml", "--local", "--store", str(store), "--name", "cnn",
         "--", "train.py", "--epochs", "2", "--samples", "1024"],
        cwd=folder, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    lines = []
    for line in first.stdout:  # SIGTERM as a drained node's pod gets it: to devctl's process
        lines.append(line)
        if line.startswith("step 10 "):
            first.send_signal(signal.SIGTERM)
            break
    output = "".join(lines) + first.stdout.read()
    assert first.wait(timeout=120) == 0, output
    assert "building environment" in output
    stopped_at = int(re.findall(r"checkpoint step (\d+)", output)[-1])
    # 16 steps an epoch: the stop lands before the end, however loaded the machine.
    assert 10 <= stopped_at < 32 and "done at" not in output
    second = local(project, "--", "train.py", "--epochs", "3", "--samples", "1024")
    assert second.returncode == 0, second.stderr
    assert "unchanged, already stored" in second.stderr
    assert "reused" in second.stderr and "building environment" not in second.stderr
    assert f"resumed from step-{stopped_at:08d}.pt" in second.stdout
    assert "done at step 48" in second.stdout
    job = store / "checkpoints" / "cnn"
    saved = sorted({stopped_at, 16, 32, 48})  # the stop's, then each epoch's end
    assert sorted(p.name for p in job.glob("step-*.pt")) == [f"step-{n:08d}.pt" for n in saved]
    assert (job / "outputs" / "model.pt").is_file()
    # Real TensorBoard over the job's folder, as the team's reads the team's checkpoints: the
    # resumed run continues the first one's curve.
    with tensorboard(str(job.parent), tmp_path / "tensorboard.log") as url:
        shown = series(url, "cnn/tensorboard", "loss/train", 48)
    assert [step for step, _ in shown] == list(range(1, 49))


def test_requirements_that_do_not_install_end_with_pips_line_and_exit_2(project):
    folder = project[0]
    (folder / "requirements.txt").write_text("no-such-package==1.0\n")
    started = time.monotonic()
    done = local(project, "--", "train.py")
    assert done.returncode == 2
    assert "pip install -r requirements.txt failed: ERROR: " in done.stderr
    assert "no-such-package" in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 60
    envs = project[1] / "user-code" / "envs"
    assert not [p for p in envs.iterdir() if p.is_dir()]  # nothing half-built is kept


def test_a_script_that_does_not_compile_fails_once_with_its_error(project):
    folder = project[0]
    (folder / "train.py").write_text("def broken(:\n    pass\n")
    (folder / "requirements.txt").write_text("")
    done = local(project, "--", "train.py")
    assert done.returncode == 2
    assert "train.py does not compile:" in done.stderr and "SyntaxError" in done.stderr
    assert "torch.distributed" not in done.stderr  # torchrun never started


def test_the_launcher_takes_help_after_the_script_as_the_scripts():
    from trainer.launch import asks_for_help, entry_point

    assert entry_point(["--nproc-per-node", "2", "train.py", "--lr", "1"]) == ("script", "train.py")
    assert entry_point(["--standalone", "-m", "pkg.mod", "-x"]) == ("module", "pkg.mod")
    assert entry_point(["--nnodes=1:2", "--rdzv-backend", "c10d"]) is None
    assert asks_for_help(["--standalone", "--help"])
    assert not asks_for_help(["--nproc-per-node", "2", "train.py", "--help"])
    assert not asks_for_help(["-m", "trainer", "-h"])


def test_the_folder_leaves_out_what_git_ignores_there(tmp_path):
    from mesh.workdir import DEFAULT_EXCLUDES, pack

    folder = tmp_path / "project"
    (folder / "data").mkdir(parents=True)
    (folder / "train.py").write_text("print('hi')\n")
    (folder / "notes.txt").write_text("untracked, not ignored\n")
    (folder / "data" / "big.bin").write_bytes(b"x" * 1000)
    (folder / "model.ckpt").write_bytes(b"weights")
    (folder / ".gitignore").write_text("data/\n*.ckpt\n")
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "add", "train.py", ".gitignore"], check=True)
    entries = pack(folder, DEFAULT_EXCLUDES, 100).entries
    assert entries == (".gitignore", "notes.txt", "train.py")
    # Outside a git work tree every file goes, as before.
    subprocess.run(["rm", "-rf", str(folder / ".git")], check=True)
    assert "data/big.bin" in pack(folder, DEFAULT_EXCLUDES, 100).entries


def test_the_optional_helper_saves_resumes_keeps_the_newest_and_turns_sigterm_into_a_flag(
    tmp_path, monkeypatch
):
    import torch

    from trainer.contract import Checkpoints, StopSignal

    monkeypatch.setenv("CHECKPOINT_DIR", str(tmp_path / "job"))
    checkpoints = Checkpoints(keep=2)
    assert checkpoints.newest() == (0, None)
    for step in (10, 20, 30):
        checkpoints.save(step, {"w": torch.full((2,), float(step))})
    assert checkpoints.steps() == [20, 30]  # the oldest pruned, nothing partial left
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == [
        "step-00000020.pt",
        "step-00000030.pt",
    ]
    step, state = checkpoints.newest()
    assert step == 30 and state["w"].tolist() == [30.0, 30.0]
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        stop = StopSignal()
        assert not stop.agreed()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.agreed()
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
