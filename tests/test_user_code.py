"""Your own code: `devctl submit` of a folder the platform did not write (examples/your-own-code,
a CNN with its own checkpoints), rendered as the platform's jobs, and run here through the same
trainer.user_code the pods run: real torchrun, real pip over a local package index, real
TensorBoard event files."""

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from devservers.job_status import COMPLETION_INDEX, JOBSET_NAME, REPLICATED_JOB
from infra.config import parse_stack_config
from tests.admission_rules import refusals
from tests.conftest import ROOT, stack_values
from tests.crd_schema import CRD_DIR, cel_violations, conformance_errors, load_crd
from tests.job_pods import trainjob_pods
from tests.kube_api import Kubelet, admission_policies, rbac_of, user
from tests.kube_api.rbac import Authorizer
from tests.kube_api.server import KubeAPI
from tests.openssh import account, free_port
from tests.tensorboard_view import series, tensorboard
from tests.test_roll import create, kind
from tests.test_trainjob import ALICE, cel_admission
from trainer import TRAINER_UID
from workloads.manifests import QUEUE_LABEL, training_runtime

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


def rendered(*args: str) -> dict:
    done = devctl("submit", "-f", str(EXAMPLE / "task.yaml"), "--dry-run", "-n", "team-a", *args)
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
    done = devctl("submit", "-f", str(EXAMPLE / "task.yaml"), "--dry-run", "-n", "team-a", *args)
    assert done.returncode == 2, done.stdout
    assert said in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_a_task_file_names_each_bad_key(tmp_path):
    task = tmp_path / "task.yaml"
    task.write_text("pool: gpu-small\nrun: [train.py]\nnode: 2\nimage: 3\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    done = devctl("submit", "-f", str(task), "--dry-run", "-n", "team-a")
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


def wheel(index: Path, name: str, version: str, code: str) -> None:
    """A pure-Python wheel, as pip installs it from a local index (PEP 427)."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": code,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(index / f"{name}-{version}-py3-none-any.whl", "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)


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


def test_locally_it_installs_once_trains_on_two_ranks_and_resumes(project, tmp_path):
    first = local(project, "--", "train.py", "--epochs", "1")
    assert first.returncode == 0, first.stderr
    assert "building environment" in first.stderr
    assert "checkpoint step 32" in first.stdout and "done at step 32" in first.stdout
    second = local(project, "--", "train.py", "--epochs", "2")
    assert second.returncode == 0, second.stderr
    assert "unchanged, already stored" in second.stderr
    assert "reused" in second.stderr and "building environment" not in second.stderr
    assert "resumed from step-00000032.pt" in second.stdout and "done at step 64" in second.stdout
    job = project[1] / "checkpoints" / "cnn"
    assert sorted(p.name for p in job.glob("step-*.pt")) == [
        "step-00000032.pt",
        "step-00000064.pt",
    ]
    assert (job / "outputs" / "model.pt").is_file()
    # Real TensorBoard over the job's folder, as the team's reads the team's checkpoints: the
    # resumed run continues the first one's curve.
    with tensorboard(str(job.parent), tmp_path / "tensorboard.log") as url:
        shown = series(url, "cnn/tensorboard", "loss/train", 64)
    assert [step for step, _ in shown] == list(range(1, 65))


def test_sigterm_stops_the_ranks_with_a_checkpoint_and_exit_0(project):
    folder, store, env = project
    process = subprocess.Popen(
        [*DEVCTL, "submit", "-f", "task.yaml", "--local", "--store", str(store), "--name", "cnn",
         "--", "train.py", "--epochs", "1000"],
        cwd=folder, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("step 10 "):
            process.send_signal(signal.SIGTERM)
            break
    output = "".join(lines) + process.stdout.read()
    assert process.wait(timeout=120) == 0, output
    assert "checkpoint step" in output
    saved = list((store / "checkpoints" / "cnn").glob("step-*.pt"))
    assert len(saved) == 1


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

TEAM = "team-a"
IMAGE = "registry.example/trainer@sha256:" + "a" * 64


@pytest.fixture
def cluster(dev_plan, tmp_path, monkeypatch):
    yield from local_cluster(dev_plan, tmp_path, monkeypatch, None)


@pytest.fixture
def trainer_cluster(dev_plan, tmp_path, monkeypatch):
    """The cluster, its pods run as the trainer image's user (uid 10001 when root)."""
    home = Path(tempfile.mkdtemp(prefix="trainer-home-"))
    user = account("tp-trainer", home, uid=TRAINER_UID)
    user.own(home)
    yield from local_cluster(dev_plan, tmp_path, monkeypatch, user)


def local_cluster(dev_plan, tmp_path, monkeypatch, runs_as):
    """The local Kubernetes API with the dev plan's RBAC and admission policies, the team's
    namespace and LocalQueue, the upstream CRDs of the jobs (Trainer v2.3 with the pools'
    runtimes, PyTorchJob v1) and a kubelet that runs pods as local processes as `runs_as`."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the client's discovery cache
    api = KubeAPI(Authorizer(rbac_of(dev_plan))).start()
    api.runtime = Kubelet(runs_as)
    api.policies = admission_policies(dev_plan)
    api.admission.append(cel_admission)
    try:
        paths = [*sorted((CRD_DIR / "trainer").glob("*.yaml")),
                 CRD_DIR / "training-operator" / "kubeflow.org_pytorchjobs.yaml",
                 CRD_DIR / "kueue" / "kueue.x-k8s.io_localqueues.yaml"]  # fmt: skip
        for path in paths:
            create(api, "customresourcedefinitions", "", load_crd(path), "apiextensions.k8s.io")
        api.settle()
        for namespace in dev_plan.of_type("kubernetes:core/v1:Namespace"):
            if namespace.inputs["metadata"]["name"] in (TEAM, "research"):
                create(api, "namespaces", "", namespace.inputs)
        for queue in dev_plan.of_type("kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue"):
            if queue.inputs["metadata"]["namespace"] not in (TEAM, "research"):
                continue
            create(api, "localqueues", queue.inputs["metadata"]["namespace"], queue.inputs,
                   "kueue.x-k8s.io")  # fmt: skip
        config = parse_stack_config(stack_values("dev"), "Pulumi.dev.yaml")
        for pool in config.node_pools:
            runtime = training_runtime(pool, IMAGE, config.storage.shared_file_systems, "b")
            create(api, "clustertrainingruntimes", "", runtime, "trainer.kubeflow.org")
        yield api
    finally:
        api.stop()


def as_member(api, who, path: Path) -> dict:
    path.write_text(yaml.safe_dump(api.kubeconfig(api.add_token(who), TEAM)))
    return {"KUBECONFIG": str(path)}


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
    (folder / "step-00000064.pt").write_bytes(b"weights")
    out = tmp_path / "fetched"
    done = devctl("fetch", "cnn", "--out", str(out), env=env)
    assert done.returncode == 0, done.stderr
    assert (out / "outputs" / "accuracy.txt").read_text() == "0.9880\n"
    done = devctl("fetch", "cnn", "step-00000064.pt", "--out", str(out), env=env)
    assert (out / "step-00000064.pt").read_bytes() == b"weights", done.stderr
    # The copy pods are gone; the job's own pods stay.
    assert all(p["metadata"]["name"].startswith("cnn-") for p in cluster.objects("pods", TEAM))
    outside = devctl("fetch", "cnn", "../other-job", env=env)
    assert outside.returncode == 1 and "allowed: a path inside the job's folder" in outside.stderr
    absent = devctl("fetch", "cnn", "nothing-here", "--out", str(out), env=env)
    assert absent.returncode == 1 and absent.stderr.startswith(
        "devctl: copying /efs/checkpoints/cnn/nothing-here (namespace team-a) failed"
    )
    assert cluster.refusals == []


def running(api, pods: list[dict], timeout: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        found = [api.read("pods", TEAM, p["metadata"]["name"]) for p in pods]
        if all((p.get("status") or {}).get("phase") == "Running" for p in found):
            return found
        assert time.monotonic() < deadline, "the job's pods did not start"
        time.sleep(0.2)


class Node:
    """A pod's container command, run in the pod (its PID 1 only sleeps: the local kubelet
    runs containers' commands through exec), its output collected."""

    def __init__(self, api, pod: dict):
        self.api, self.pod, self.lines = api, pod, []
        command = pod["spec"]["containers"][0]["command"]
        self.process = api.runtime.run_in(
            pod, command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line)

    def saw(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.process.poll() is None or self.reader.is_alive(), self.output
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.output}"
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM to the pod's launcher, as the kubelet sends it to a container's PID 1."""
        stop = self.api.runtime.run_in(self.pod, ["pkill", "-TERM", "-f", "trainer.launch"])
        stop.wait(timeout=30)

    def wait(self, timeout: float = 120) -> int:
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"still running after {timeout} s:\n{self.output}") from None
        self.reader.join(timeout=10)
        return code

    @property
    def output(self) -> str:
        return "".join(self.lines)


def run_nodes(api, pods: list[dict]) -> list[Node]:
    return [Node(api, pod) for pod in running(api, pods)]


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

    def start() -> list[Node]:
        pods = trainjob_pods(trainjob, runtime)
        # The one deviation: the pods share this machine's network, so the rendezvous takes a
        # free port rather than 29500, which another test may hold.
        port = str(free_port("127.0.0.1"))
        for pod in pods:
            for variable in pod["spec"]["containers"][0]["env"]:
                if variable["name"] == "PET_MASTER_PORT":
                    variable["value"] = port
            create(api, "pods", TEAM, pod)
        return run_nodes(api, pods)

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
