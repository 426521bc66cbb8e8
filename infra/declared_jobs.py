"""The training jobs a stack declares, read from their manifests: where they run, how many
nodes they take, the trainer options they pass and where they keep checkpoints.

Read from the declared PyTorchJob and MPIJob objects (not stack config), so the plan's expected
figure and usage estimates and the policy pack see the same jobs the cluster is handed.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from infra.components.lustre import CLAIM as FSX_CLAIM
from infra.components.node_pools import POOL_LABEL
from infra.components.shared_file_system import CLAIM as EFS_CLAIM
from infra.declared import Declared, dig, listed
from infra.resource_types import MPI_JOB, PYTORCH_JOB
from trainer.options import OptionsError, TrainConfig, parse_options
from trainer.presets import PRESETS, ModelConfig

REPLICA_SPECS = {PYTORCH_JOB: "pytorchReplicaSpecs", MPI_JOB: "mpiReplicaSpecs"}
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


def declared_jobs(stack: Sequence[Declared]) -> list[DeclaredJob]:
    jobs = []
    for r in stack:
        if r.type not in REPLICA_SPECS:
            continue
        specs = dig(r.props, "spec", REPLICA_SPECS[r.type]) or {}
        nodes, ranks, pool, options = 0, 0, None, None
        pods = [dig(spec, "template", "spec") for spec in specs.values()]
        for (role, spec), pod in zip(specs.items(), pods, strict=True):
            pool = pool or dig(pod, "nodeSelector", POOL_LABEL)
            if role != LAUNCHER:
                replicas = int(dig(spec, "replicas") or 1)
                gpus = sum(
                    int(dig(c, "resources", "limits", GPU) or 0)
                    for c in listed(dig(pod, "containers"))
                )
                nodes += replicas
                ranks += replicas * max(gpus, 1)
            for container in listed(dig(pod, "containers")):
                command = [str(c) for c in listed(dig(container, "command"))]
                args = _trainer_args(command + [str(a) for a in listed(dig(container, "args"))])
                if args is not None:
                    try:
                        options = parse_options(args)
                    except OptionsError:
                        continue
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
