"""Your own code on the cluster, with a team member's rights: `devctl submit` stores the folder's
snapshot through a pod of the team's namespace and creates the job, `logs` and `fetch` read it
back, and the job's pods, made as Kubeflow Trainer v2.3 and JobSet v0.12 make them
(infra/operators/tests/job_pods.py), run the code as the trainer's user on the local kubelet;
the Kubeflow SDK's CustomTrainer on the same runtimes. The local API holds the dev plan's RBAC
and admission policies (tests/team_cluster.py)."""

import os
import re
import tempfile
from pathlib import Path

import pytest
import yaml

from devservers.job_status import COMPLETION_INDEX, JOBSET_NAME, REPLICATED_JOB
from infra.operators.tests.job_pods import pod_failure_action, pytorchjob_after_failure
from tests.e2e.test_roll import create, kind
from tests.integration.test_user_code import devctl, rendered
from tests.kube_api import user
from tests.kube_api.kubelet import IMAGE_ENV
from tests.team_cluster import (
    EXAMPLE,
    IMAGE,
    TEAM,
    as_member,
    image_python,
    start_pytorchjob,
    start_trainjob,
    team_cluster,
    trainer_account,
    user_project,
)
from tests.tensorboard_view import series, tensorboard
from workloads.manifests import QUEUE_LABEL
from workloads.tests.test_trainjob import ALICE

# -- to the cluster, with a member's rights --------------------------------------------------


@pytest.fixture
def project(tmp_path):
    return user_project(tmp_path)


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
    """A pod of a TrainJob's node as JobSet labels it (infra/operators/tests/trainer_rules.py)
    whose container wrote `log`; gated, so the kubelet leaves it to the test."""
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


def test_an_elastic_job_trains_in_the_pods_the_training_operator_makes(
    trainer_cluster, project, tmp_path
):
    """`--nodes 1:2`: a PyTorchJob, its pods made as the training operator v1.9.4 makes them
    (infra/operators/tests/job_pods.py), torchrun's c10d rendezvous across them; a kill is
    restarted, a bad input fails the job."""
    api, (folder, _, pip) = trainer_cluster, project
    env = as_member(api, ALICE, tmp_path / "kubeconfig")
    pip_env = [a for k, v in pip.items() for a in ("--env", f"{k}={v}")]
    submitted = devctl("submit", "-f", "task.yaml", "--name", "cnn", "--pool", "cpu",
                       "--nodes", "1:2", *pip_env, "--", "train.py", "--samples", "256",
                       "--epochs", "1", cwd=folder, env=env)  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = api.read("pytorchjobs", TEAM, "cnn", group="kubeflow.org")
    nodes = start_pytorchjob(api, job)
    assert [node.wait(timeout=180) for node in nodes] == [0, 0], nodes[0].output
    assert "done at step 4" in nodes[0].output + nodes[1].output
    assert api.refusals == []
    assert pytorchjob_after_failure(job, 2) == "fail"  # input no restart fixes
    assert pytorchjob_after_failure(job, 137) == "restart"  # killed: a new pod


def test_a_script_that_does_not_compile_fails_the_job_once_with_its_error(
    trainer_cluster, project, tmp_path
):
    """Every node's pod ends with exit 2 and the compiler's message, before torchrun starts;
    the runtime's pod failure policy makes that the end of the job, not a new pod."""
    api, (folder, _, _) = trainer_cluster, project
    (folder / "train.py").write_text("def train(:\n    pass\n")
    env = as_member(api, ALICE, tmp_path / "kubeconfig")
    submitted = devctl("submit", "-f", "task.yaml", "--name", "broken", "--pool", "cpu",
                       cwd=folder, env=env)  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    trainjob = api.read("trainjobs", TEAM, "broken", group="trainer.kubeflow.org")
    runtime = api.read("clustertrainingruntimes", "", "torch-cpu", group="trainer.kubeflow.org")
    nodes = start_trainjob(api, trainjob, runtime)
    assert [node.wait() for node in nodes] == [2, 2]
    assert all("train.py does not compile" in node.output for node in nodes), nodes[0].output
    assert all("SyntaxError" in node.output for node in nodes)
    job = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert pod_failure_action(job, {"node": 2}) == "FailJob"  # the job fails; no new pod
    assert pod_failure_action(job, {"node": 1}) == "Count"  # a crash: a new pod, backoffLimit
    evicted = pod_failure_action(job, {"node": 143}, {"DisruptionTarget"})
    assert evicted == "Ignore"  # a drained or interrupted node does not count


def sdk_train(epochs: int = 3):
    """A training function as an ML engineer hands it to the Kubeflow SDK: the SDK sends its
    source, not this module, to the pods (no dollar sign in it: the SDK's heredoc would expand
    it, as the docs say)."""
    import os
    import sys

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
    # The DDP model (its reducer holds the group) gone and every rank done before any tears gloo
    # down. Even so a rank aborted at exit twice in about twenty runs ("terminate called without
    # an active exception", gloo's threads at the interpreter's teardown, torch 2.13): with its
    # output flushed, a rank ends without that teardown.
    del model, optimizer
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


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
    assert (workdir / Path(__file__).name).is_file() and (workdir / "pip_install.log").is_file()
    assert api.refusals == []
