"""A team's corner of a cluster for the tests and benchmark of your own code (tests/
test_user_code.py, tests/bench_submit.py): the local Kubernetes API under the dev plan's RBAC and
admission policies, the jobs' upstream CRDs and runtimes, a kubelet that runs pods as local
processes, and the pods of a TrainJob as the Trainer and JobSet make them
(infra/operators/tests/job_pods.py), their container commands run in them."""

import contextlib
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import yaml

from infra.core.tests.crd_schema import CRD_DIR, load_crd
from infra.operators.tests import trainer_rules
from infra.operators.tests.job_pods import pytorchjob_pods, pytorchjob_services, trainjob_pods
from infra.stack.loading import parse_stack_config
from tests.e2e.test_roll import create
from tests.kube_api import Kubelet, admission_policies, rbac_of
from tests.kube_api.rbac import Authorizer
from tests.kube_api.server import KubeAPI
from tests.openssh import account, free_port
from tests.plugin import ROOT, stack_values
from trainer import TRAINER_UID
from workloads.manifests import training_runtime
from workloads.tests.test_trainjob import PUBLIC, PUBLIC_RBAC, cel_admission

TEAM = "team-a"
IMAGE = "registry.example/trainer@sha256:" + "a" * 64
EXAMPLE = ROOT / "examples" / "your-own-code"


def user_project(root: Path) -> tuple[Path, Path, dict]:
    """The example's folder with a requirement only a local index has: (the folder, a store
    for --local, the variables that point pip at the index)."""
    folder = root / "project"
    folder.mkdir()
    for name in ("train.py", "task.yaml"):
        (folder / name).write_text((EXAMPLE / name).read_text())
    (folder / "requirements.txt").write_text("shapes-helper==0.1\n")
    train = (folder / "train.py").read_text()
    marker = "import torch\n"
    (folder / "train.py").write_text(train.replace(marker, f"import shapes_helper\n{marker}", 1))
    index = root / "index"
    index.mkdir()
    wheel(index, "shapes_helper", "0.1", "SIDE = 16\n")
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "OMP_NUM_THREADS": "1"}
    return folder, root / "store", env


def trainer_account():
    """The trainer image's user (uid 10001, with a home of its own) when root, else the caller."""
    home = Path(tempfile.mkdtemp(prefix="trainer-home-"))
    user = account("tp-trainer", home, uid=TRAINER_UID)
    user.own(home)
    return user


@contextlib.contextmanager
def team_cluster(dev_plan, runs_as=None):
    """The local Kubernetes API with the dev plan's RBAC and admission policies, the team's
    namespace and LocalQueue, the upstream CRDs of the jobs (Trainer v2.3 with the pools'
    runtimes, PyTorchJob v1) and a kubelet that runs pods as local processes as `runs_as`."""
    api = KubeAPI(Authorizer([*rbac_of(dev_plan), *PUBLIC_RBAC])).start()
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
        # What the Trainer's manager overlay gives the SDK to read
        # (workloads/tests/test_trainjob.py).
        create(api, "namespaces", "", {"metadata": {"name": "kubeflow-system"}})
        version = {"kubeflow_trainer_version": trainer_rules.TRAINER_VERSION}
        public = {"metadata": {"name": PUBLIC}, "data": version}
        create(api, "configmaps", "kubeflow-system", public)
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


def as_member(api, who, path: Path) -> dict:
    path.write_text(yaml.safe_dump(api.kubeconfig(api.add_token(who), TEAM)))
    return {"KUBECONFIG": str(path)}


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


def image_python(root: Path) -> Path:
    """An interpreter that stands in for the trainer image's: the PyTorch image's Python is no
    virtualenv, so `pip install --user` (the Kubeflow SDK's) works there and its user site is on
    sys.path. This one is a venv over the base interpreter with the suite's packages added (a
    .pth), and torchrun of its own. Returns its bin folder, for PATH."""
    root.chmod(0o755)  # the pods' user runs it
    subprocess.run(
        [sys.base_prefix + "/bin/python3", "-m", "venv", "--system-site-packages", "--without-pip",
         str(root)],
        check=True,
    )  # fmt: skip
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    suite = [p for p in sys.path if p.endswith("site-packages")]
    lines = [f"import site; site.addsitedir({p!r})" for p in suite]
    (root / "lib" / version / "site-packages" / "suite.pth").write_text("\n".join(lines) + "\n")
    torchrun = root / "bin" / "torchrun"
    torchrun.write_text(f"#!{root}/bin/python\nfrom torch.distributed.run import main\nmain()\n")
    torchrun.chmod(0o755)
    return root / "bin"


def start_pytorchjob(api, job: dict) -> list:
    """The PyTorchJob's Worker pods and Services, created as the operator creates them, the pods
    running their commands (Node). The one deviation, as start_trainjob's: the rendezvous on a
    free port of this machine, whose network the pods share."""
    pods = pytorchjob_pods(job)
    port = str(free_port("127.0.0.1"))
    for service in pytorchjob_services(job):
        create(api, "services", TEAM, service)
    for pod in pods:
        for variable in pod["spec"]["containers"][0]["env"]:
            if variable["name"] == "PET_RDZV_ENDPOINT":
                variable["value"] = f"{variable['value'].rpartition(':')[0]}:{port}"
        create(api, "pods", TEAM, pod)
    return run_nodes(api, pods)


def start_trainjob(
    api, trainjob: dict, runtime: dict, workdir: Path | None = None, path: str | None = None
) -> list:
    """The TrainJob's node pods, created and running their commands (Node). The one deviation
    from the controllers: the pods share this machine's network, so the rendezvous takes a free
    port rather than 29500, which another test may hold. `workdir` and `path`: the containers'
    working directory and PATH, standing in for the image's."""
    pods = trainjob_pods(trainjob, runtime)
    port = str(free_port("127.0.0.1"))
    for pod in pods:
        container = pod["spec"]["containers"][0]
        if workdir is not None:
            container["workingDir"] = str(workdir)
        if path is not None:
            container["env"].append({"name": "PATH", "value": path})
        for variable in container["env"]:
            if variable["name"] == "PET_MASTER_PORT":
                variable["value"] = port
        create(api, "pods", TEAM, pod)
    return run_nodes(api, pods)
