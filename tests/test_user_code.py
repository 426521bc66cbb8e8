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
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from devservers import cli
from devservers.job_status import COMPLETION_INDEX, JOBSET_NAME, REPLICATED_JOB
from tests.admission_rules import refusals
from tests.conftest import ROOT
from tests.crd_schema import cel_violations, conformance_errors
from tests.kube_api import admission_policies, user
from tests.kube_api.kubelet import IMAGE_ENV
from tests.team_cluster import (
    IMAGE,
    TEAM,
    as_member,
    image_python,
    start_trainjob,
    team_cluster,
    trainer_account,
    wheel,
)
from tests.tensorboard_view import series, tensorboard
from tests.test_roll import create, kind
from tests.test_trainjob import ALICE
from workloads.manifests import QUEUE_LABEL

EXAMPLE = ROOT / "examples" / "your-own-code"
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
    job = rendered("--nodes", nodes, "--name", "cnn")
    assert job["kind"] == kind
    assert job["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert conformance_errors(job) == [] and cel_violations(job) == []
    namespace = next(
        n.inputs
        for n in dev_plan.of_type("kubernetes:core/v1:Namespace")
        if n.inputs["metadata"]["name"] == "team-a"
    )
    for name, policy in admission_policies(dev_plan).items():
        found = refusals(policy, "CREATE", job, namespace=namespace, **MEMBER)
        assert not found, (name, found)


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
    """The example's folder with a requirement only the local index has."""
    folder = tmp_path / "project"
    folder.mkdir()
    for name in ("train.py", "task.yaml"):
        (folder / name).write_text((EXAMPLE / name).read_text())
    (folder / "requirements.txt").write_text("shapes-helper==0.1\n")
    train = (folder / "train.py").read_text()
    marker = "import torch\n"
    (folder / "train.py").write_text(train.replace(marker, f"import shapes_helper\n{marker}", 1))
    index = tmp_path / "index"
    index.mkdir()
    wheel(index, "shapes_helper", "0.1", "SIDE = 16\n")
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "OMP_NUM_THREADS": "1"}
    return folder, tmp_path / "store", env


def local(project, *args: str, **popen):
    folder, store, env = project
    command = ["submit", "-f", "task.yaml", "--local", "--store", str(store), "--name", "cnn"]
    return devctl(*command, *args, cwd=folder, env=env, **popen)


def test_locally_it_installs_once_stops_on_sigterm_with_a_checkpoint_and_resumes(project, tmp_path):
    folder, store, env = project
    first = subprocess.Popen(
        [*DEVCTL, "submit", "-f", "task.yaml", "--local", "--store", str(store), "--name", "cnn",
         "--", "train.py", "--epochs", "1"],
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
    assert 10 <= stopped_at < 32 and "done at" not in output
    second = local(project, "--", "train.py", "--epochs", "2")
    assert second.returncode == 0, second.stderr
    assert "unchanged, already stored" in second.stderr
    assert "reused" in second.stderr and "building environment" not in second.stderr
    assert f"resumed from step-{stopped_at:08d}.pt" in second.stdout
    assert "done at step 64" in second.stdout
    job = store / "checkpoints" / "cnn"
    assert sorted(p.name for p in job.glob("step-*.pt")) == [
        f"step-{stopped_at:08d}.pt",
        "step-00000032.pt",
        "step-00000064.pt",
    ]
    assert (job / "outputs" / "model.pt").is_file()
    # Real TensorBoard over the job's folder, as the team's reads the team's checkpoints: the
    # resumed run continues the first one's curve.
    with tensorboard(str(job.parent), tmp_path / "tensorboard.log") as url:
        shown = series(url, "cnn/tensorboard", "loss/train", 64)
    assert [step for step, _ in shown] == list(range(1, 65))


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


# -- to the cluster, with a member's rights --------------------------------------------------


@pytest.fixture
def cluster(dev_plan, tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the client's discovery cache
    with team_cluster(dev_plan) as api:
        yield api


@pytest.fixture
def trainer_cluster(dev_plan, tmp_path, monkeypatch):
    """The cluster, its pods run as the trainer image's user (uid 10001 when root)."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with team_cluster(dev_plan, trainer_account()) as api:
        yield api


def test_a_member_submits_a_folder_its_code_reaches_the_teams_store_once(cluster, tmp_path):
    env = as_member(cluster, ALICE, tmp_path / "kubeconfig")
    first = devctl("submit", "-f", str(EXAMPLE / "task.yaml"), "--name", "cnn", env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"trainjob/cnn created in {TEAM}, queue {TEAM}\n")
    job = cluster.read("trainjobs", TEAM, "cnn", group="trainer.kubeflow.org")
    command = job["spec"]["trainer"]["command"]
    code = command[command.index("--code") + 1]
    assert job["spec"]["trainer"]["image"] == IMAGE  # the pool's runtime's
    claim = cluster.runtime.dir / "claims" / TEAM / "efs-shared"
    stored = claim / "user-code" / "code" / f"{code}.tar"
    from mesh.workdir import DEFAULT_EXCLUDES, pack

    assert stored.read_bytes() == pack(EXAMPLE, DEFAULT_EXCLUDES, 100).data
    assert "sent" in first.stderr and "not sent" not in first.stderr
    # Unchanged code is not sent again; an elastic job is a PyTorchJob.
    again = devctl("submit", "-f", str(EXAMPLE / "task.yaml"), "--name", "cnn-elastic",
                   "--nodes", "1:2", env=env)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "unchanged, not sent" in again.stderr
    assert cluster.read("pytorchjobs", TEAM, "cnn-elastic", group="kubeflow.org")
    # The upload pods ran as the trainer's user in the team's queue, and are gone.
    uploads = [obj for _, kind, what, obj, _ in cluster.history
               if kind.plural == "pods" and what == "ADDED"]  # fmt: skip
    assert len(uploads) == 2 and cluster.objects("pods", TEAM) == []
    assert {p["metadata"]["labels"][QUEUE_LABEL] for p in uploads} == {TEAM}
    assert all(p["spec"]["securityContext"]["runAsUser"] == 10001 for p in uploads)
    assert cluster.refusals == []


def test_a_member_of_another_team_is_refused_in_one_line_and_nothing_is_made(cluster, tmp_path):
    bob = user("arn:aws:iam::123456789012:user/bob", ["team:research"])
    env = as_member(cluster, bob, tmp_path / "kubeconfig")
    done = devctl("submit", "-f", str(EXAMPLE / "task.yaml"), "--name", "cnn", env=env)
    assert done.returncode == 2
    assert done.stderr.startswith("devctl: listing the LocalQueues of namespace team-a: ")
    assert "forbidden" in done.stderr and len(done.stderr.splitlines()) == 1
    assert (
        cluster.objects("pods", TEAM) == []
        and cluster.objects("trainjobs", TEAM, group="trainer.kubeflow.org") == []
    )
    # Nor can he read a team-a job's folder (its code, outputs, environments are on team-a's
    # claim, which only team-a's pods mount).
    create(cluster, "trainjobs", TEAM, rendered("--name", "cnn"), "trainer.kubeflow.org")
    fetched = devctl("fetch", "cnn", "--out", str(tmp_path / "out"), "-n", TEAM, env=env)
    assert fetched.returncode == 1 and "forbidden" in fetched.stderr
    assert not (tmp_path / "out" / "outputs").exists()


def test_without_a_kubeconfig_submit_says_so_in_one_line(tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "none")}
    done = devctl("submit", "-f", str(EXAMPLE / "task.yaml"), "-n", TEAM, env=env)
    assert done.returncode == 2
    assert (
        done.stderr == f"devctl: no kubeconfig at {tmp_path / 'none'}: set KUBECONFIG, or "
        "run `aws eks update-kubeconfig`\n"
    )


def node_pod(api, job: str, index: int, log: str) -> None:
    """A pod of a TrainJob's node as JobSet labels it (tests/trainer_rules.py) whose container
    wrote `log`; gated, so the kubelet leaves it to the test."""
    labels = {JOBSET_NAME: job, REPLICATED_JOB: "node", COMPLETION_INDEX: str(index)}
    body = {
        "metadata": {"name": f"{job}-node-0-{index}-x", "labels": labels},
        "spec": {"schedulingGates": [{"name": "test"}],
                 "containers": [{"name": "node", "image": IMAGE}]},
    }  # fmt: skip
    made = create(api, "pods", TEAM, body)
    run = f"containerd://{job}-{index}"
    status = {"phase": "Running", "containerStatuses": [
        {"name": "node", "containerID": run, "state": {"running": {}}, "ready": True}]}  # fmt: skip
    api.call(api.replace, kind(api, "pods"), made, {**made, "status": status})
    api.container_logs[run] = log


def test_logs_prints_a_nodes_output_and_fetch_copies_the_jobs_outputs(cluster, tmp_path):
    job = rendered("--name", "cnn")
    create(cluster, "trainjobs", TEAM, job, "trainer.kubeflow.org")
    for index in (0, 1):
        node_pod(cluster, "cnn", index, f"node {index}: step 10 loss 0.5\n")
    env = as_member(cluster, ALICE, tmp_path / "kubeconfig")
    done = devctl("logs", "cnn", "--node", "1", env=env)
    assert (done.returncode, done.stdout) == (0, "node 1: step 10 loss 0.5\n"), done.stderr
    missing = devctl("logs", "cnn", "--node", "4", env=env)
    assert missing.returncode == 1
    assert missing.stderr == "devctl: job cnn has no pod of node 4 (nodes with pods: 0, 1)\n"
    # What the job's pods wrote in its folder, on the team's claim (the kubelet's folder of it).
    folder = cluster.runtime.dir / "claims" / TEAM / "efs-shared" / "checkpoints" / "cnn"
    (folder / "outputs").mkdir(parents=True)
    (folder / "outputs" / "accuracy.txt").write_text("0.9880\n")
    out = tmp_path / "fetched"
    done = devctl("fetch", "cnn", "--out", str(out), env=env)
    assert done.returncode == 0, done.stderr
    assert (out / "outputs" / "accuracy.txt").read_text() == "0.9880\n"
    # The copy pods are gone; the job's own pods stay.
    assert all(p["metadata"]["name"].startswith("cnn-") for p in cluster.objects("pods", TEAM))
    outside = devctl("fetch", "cnn", "../other-job", env=env)
    assert outside.returncode == 1 and "allowed: a path inside the job's folder" in outside.stderr
    absent = devctl("fetch", "cnn", "nothing-here", "--out", str(out), env=env)
    assert absent.returncode == 1 and absent.stderr.startswith(
        "devctl: copying /efs/checkpoints/cnn/nothing-here (namespace team-a) failed"
    )
    assert cluster.refusals == []


def test_a_submitted_folder_trains_in_the_pods_the_controllers_make_as_the_trainers_user(
    trainer_cluster, project, tmp_path
):
    """The job of devctl submit, its pods made as the Trainer and JobSet make them, run as uid
    10001 on the local kubelet: they unpack the snapshot, install the requirements once from a
    local index, train with a rank per node, stop on SIGTERM with a checkpoint, resume."""
    api, (folder, _, pip) = trainer_cluster, project
    env = as_member(api, ALICE, tmp_path / "kubeconfig")
    pip_env = [a for k, v in pip.items() for a in ("--env", f"{k}={v}")]
    submitted = devctl("submit", "-f", "task.yaml", "--name", "cnn", "--pool", "cpu",
                       *pip_env, "--", "train.py", "--samples", "1024", "--epochs", "1000",
                       cwd=folder, env=env)  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    trainjob = api.read("trainjobs", TEAM, "cnn", group="trainer.kubeflow.org")
    runtime = api.read("clustertrainingruntimes", "", "torch-cpu", group="trainer.kubeflow.org")

    def start() -> list:
        return start_trainjob(api, trainjob, runtime)

    first = start()
    first[0].saw("step 10 ")
    # One node drained: its ranks tell the others (the script all-reduces the stop), and all
    # save and exit 0. (A SIGTERM reaching a pod whose ranks have already ended goes to
    # torchrun, which then fails the exit barrier its peer waits in.)
    first[1].stop()
    assert [node.wait() for node in first] == [0, 0], first[0].output + first[1].output
    assert "building environment" in first[0].output + first[1].output
    assert "checkpoint step" in first[0].output
    for pod in api.objects("pods", TEAM):  # replaced, as the Job controller replaces them
        api.call(api.delete, kind(api, "pods"), pod)
    second = start()
    second[0].saw("resumed from step-")
    second[0].stop()
    assert [node.wait() for node in second] == [0, 0], second[0].output
    assert "reused" in second[0].output and "building environment" not in second[0].output
    job_folder = api.runtime.dir / "claims" / TEAM / "efs-shared" / "checkpoints" / "cnn"
    # The second run resumed from the checkpoint the first wrote on SIGTERM.
    stopped_at = re.findall(r"checkpoint step (\d+)", first[0].output)[-1]
    assert f"resumed from step-{int(stopped_at):08d}.pt" in second[0].output
    saved = list(job_folder.glob("step-*.pt"))
    assert all(p.stat().st_uid == api.runtime.account.uid for p in saved)
    with tensorboard(str(job_folder.parent), tmp_path / "tensorboard.log") as url:
        shown = series(url, "cnn/tensorboard", "loss/train", 10)
    assert [step for step, _ in shown][:10] == list(range(1, 11))
    assert api.refusals == []


def sdk_train(epochs: int = 3):
    """A training function as an ML engineer hands it to the Kubeflow SDK: the SDK sends its
    source, not this module, to the pods (no dollar sign in it: the SDK's heredoc would expand
    it, as the docs say)."""
    import os

    import shapes_helper
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(shapes_helper.SIDE, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(256, shapes_helper.SIDE)
    y = x.sum(1, keepdim=True)
    for epoch in range(epochs):
        loss = torch.nn.functional.mse_loss(model(x[rank::world]), y[rank::world])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"sdk rank {rank}/{world} node {os.environ['GROUP_RANK']} epoch {epoch} "
              f"loss {loss.item():.4f}", flush=True)  # fmt: skip
    dist.destroy_process_group()


def simple_index(root: Path) -> str:
    """A PEP 503 index of the wheels in `root`, as pip reads one from a file: URL."""
    for wheel_file in root.glob("*.whl"):
        project = wheel_file.name.split("-")[0].replace("_", "-")
        page = root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f'<a href="{wheel_file.as_uri()}">{wheel_file.name}</a>\n')
    return f"file://{root}/simple"


def test_the_kubeflow_sdks_custom_trainer_runs_its_function_on_a_platform_runtime(
    trainer_cluster, project, tmp_path
):
    """The SDK's own code writes the TrainJob (CustomTrainer: the function's source in a bash
    heredoc, its packages installed with pip --user, torchrun); its pods, made as the Trainer
    and JobSet make them, run it as the trainer's user from the image's working directory (a
    multi-node rendezvous in such pods: the test of devctl submit above)."""
    from kubeflow.trainer import CustomTrainer, KubernetesBackendConfig, TrainerClient
    from kubeflow.trainer.options import Labels

    api = trainer_cluster
    index = simple_index(Path(project[2]["PIP_FIND_LINKS"]))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(api.kubeconfig(api.add_token(ALICE), TEAM)))
    client = TrainerClient(KubernetesBackendConfig(namespace=TEAM, config_file=str(kubeconfig)))
    runtime = client.get_runtime("torch-cpu")
    name = client.train(
        runtime=runtime,
        trainer=CustomTrainer(
            func=sdk_train,
            func_args={"epochs": 3},
            packages_to_install=["shapes_helper==0.1"],
            pip_index_urls=[index],
            num_nodes=1,
            resources_per_node={"cpu": "2"},
        ),
        options=[Labels({QUEUE_LABEL: TEAM})],
    )
    trainjob = api.read("trainjobs", TEAM, name, group="trainer.kubeflow.org")
    assert trainjob["spec"]["trainer"]["command"][:2] == ["bash", "-c"]
    runtime = api.read("clustertrainingruntimes", "", "torch-cpu", group="trainer.kubeflow.org")
    # The image's working directory (trainer/Dockerfile WORKDIR /opt/trainer, owned by the
    # trainer's user) and Python: this machine's root stands in for the image, so a folder of
    # the trainer's user and an interpreter like the image's stand in for them.
    workdir = Path(tempfile.mkdtemp(prefix="opt-trainer-"))
    api.runtime.account.own(workdir)
    # Outside pytest's own folders, which only root may enter: bash looks commands up on PATH
    # with the user's own rights.
    shared = os.environ.get("TMPDIR", "/tmp")
    python = image_python(Path(tempfile.mkdtemp(prefix="image-python-", dir=shared)))
    path = f"{python}:{IMAGE_ENV['PATH']}"
    nodes = start_trainjob(api, trainjob, runtime, workdir, path)
    (node,) = nodes
    assert node.wait() == 0, node.output
    assert "Successfully installed Python packages: shapes_helper==0.1" in node.output
    for rank in (0, 1):  # two ranks: a process per CPU requested
        assert f"sdk rank {rank}/2 node 0 epoch 2 loss" in node.output
    assert (workdir / "test_user_code.py").is_file() and (workdir / "pip_install.log").is_file()
    assert api.refusals == []


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
