"""The training jobs a stack declares, read from their manifests: where they run, how many
nodes they take, the trainer options they pass and where they keep checkpoints.

Read from the declared PyTorchJob, MPIJob and TrainJob objects (not stack config), so the plan's
expected figure and usage estimates and the policy pack see the same jobs the cluster is handed.
A TrainJob's pods are its runtime's (the ClusterTrainingRuntime it names, in the same stack) with
its own trainer settings over them.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from infra.core.declared import (
    REPLICA_SPEC_KEYS,
    RUNTIME_KIND,
    Declared,
    dig,
    kind_of,
    listed,
    pod_sets,
)
from infra.core.nodes import POOL_LABEL
from infra.storage.lustre import CHECKPOINTS_CLAIM as FSX_CLAIM
from infra.storage.shared_file_system import CLAIM as EFS_CLAIM
from trainer.options import OptionsError, TrainConfig, parse_options
from trainer.presets import PRESETS, ModelConfig

TRAINJOB_KIND = "TrainJob"
# The MPI launcher runs mpirun beside the workers; it asks for one CPU, not a node.
LAUNCHER = "Launcher"
CLAIM_STORES = {EFS_CLAIM: "efs", FSX_CLAIM: "fsx"}
GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class DeclaredJob:
    name: str
    namespace: str
    pool: str
    nodes: int  # its workers at their most, one to a node
    ranks: int  # trainer processes: one per GPU of its workers (one per CPU worker)
    options: TrainConfig
    store: str  # where checkpoints go: s3, efs, fsx or local

    @property
    def model(self) -> ModelConfig:
        return PRESETS[self.options.model]

    @property
    def checkpoints(self) -> int:
        """Checkpoints a run writes: every --checkpoint-every steps and at the last step."""
        return -(-self.options.steps // self.options.checkpoint_every)


def _trainer_args(command: list[str]) -> list[str] | None:
    """What follows `-m trainer` in a container's command line (torchrun or mpirun before it)."""
    for i in range(len(command) - 1, 0, -1):
        if command[i] == "trainer" and command[i - 1] == "-m":
            return command[i + 1 :]
    return None


def _store(checkpoint_dir: str, pods: list) -> str:
    """The store under the checkpoint directory: S3, or the claim mounted there in the job's pods
    (an MPIJob's launcher passes the arguments, its workers mount the volumes)."""
    if checkpoint_dir.startswith("s3://"):
        return "s3"
    for pod in pods:
        claims = {
            dig(v, "name"): dig(v, "persistentVolumeClaim", "claimName")
            for v in listed(dig(pod, "volumes"))
        }
        for container in listed(dig(pod, "containers")):
            for mount in listed(dig(container, "volumeMounts")):
                path = str(dig(mount, "mountPath")).rstrip("/")
                if checkpoint_dir == path or checkpoint_dir.startswith(path + "/"):
                    return CLAIM_STORES.get(claims.get(dig(mount, "name")), "local")
    return "local"


def _options(container: dict, env: dict[str, str] | None = None) -> TrainConfig | None:
    """The trainer options in a container's command line, $(VAR) references expanded from `env`
    as the kubelet expands them."""
    line = [str(c) for c in listed(dig(container, "command")) + listed(dig(container, "args"))]
    for name, value in (env or {}).items():
        line = [part.replace(f"$({name})", value) for part in line]
    args = _trainer_args(line)
    if args is None:
        return None
    try:
        return parse_options(args)
    except OptionsError:
        return None


def _train_job(job: Declared, runtimes: dict[str, Declared]) -> tuple[int, int, list, dict]:
    """(nodes, ranks, pods, trainer container) of a TrainJob: its runtime's trainer pods with
    the job's image, arguments, environment and node count."""
    runtime = runtimes.get(str(dig(job.props, "spec", "runtimeRef", "name")))
    sets = pod_sets(RUNTIME_KIND, runtime.props) if runtime else {}
    if not sets:
        return 0, 0, [], {}
    _, template = next(iter(sets.values()))
    pod = dig(template, "spec") or {}
    container = dict(listed(dig(pod, "containers"))[0])
    trainer = dig(job.props, "spec", "trainer") or {}
    if dig(trainer, "args") is not None:
        container["args"] = dig(trainer, "args")
    env = {e.get("name"): e for e in listed(container.get("env"))}
    env.update({e.get("name"): e for e in listed(dig(trainer, "env"))})
    container["env"] = list(env.values())
    nodes = int(dig(trainer, "numNodes") or dig(runtime.props, "spec", "mlPolicy", "numNodes") or 1)
    gpus = int(dig(container, "resources", "limits", GPU) or 0)
    ranks = nodes * int(dig(trainer, "numProcPerNode") or max(gpus, 1))
    return nodes, ranks, [pod], container


def declared_jobs(stack: Sequence[Declared]) -> list[DeclaredJob]:
    runtimes = {
        str(dig(r.props, "metadata", "name")): r for r in stack if kind_of(r.type) == RUNTIME_KIND
    }
    jobs = []
    for r in stack:
        kind = kind_of(r.type)
        if kind == TRAINJOB_KIND:
            nodes, ranks, pods, container = _train_job(r, runtimes)
            env = {
                str(e.get("name")): str(e.get("value"))
                for e in listed(container.get("env"))
                if e.get("value") is not None
            }
            options = _options(container, env) if container else None
        elif kind in REPLICA_SPEC_KEYS:
            nodes, ranks, pods, options = _v1_job(r)
        else:
            continue
        pool = next((dig(p, "nodeSelector", POOL_LABEL) for p in pods), None)
        if pool is None or options is None:
            continue
        jobs.append(
            DeclaredJob(
                str(dig(r.props, "metadata", "name") or r.name),
                str(dig(r.props, "metadata", "namespace")),
                str(pool),
                nodes,
                ranks,
                options,
                _store(options.checkpoint_dir, pods),
            )
        )
    return jobs


def _v1_job(job: Declared) -> tuple[int, int, list, TrainConfig | None]:
    """(nodes, ranks, pods, trainer options) of a PyTorchJob or MPIJob: the workers count, the
    launcher (an MPIJob's) passes the arguments."""
    nodes, ranks, options, pods = 0, 0, None, []
    for role, (replicas, template) in pod_sets(kind_of(job.type), job.props).items():
        pod = dig(template, "spec") or {}
        pods.append(pod)
        if role != LAUNCHER:
            gpus = sum(
                int(dig(c, "resources", "limits", GPU) or 0) for c in listed(dig(pod, "containers"))
            )
            nodes += replicas
            ranks += replicas * max(gpus, 1)
        for container in listed(dig(pod, "containers")):
            options = _options(container) or options
    return nodes, ranks, pods, options
