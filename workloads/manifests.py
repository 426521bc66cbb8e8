"""Training manifests: a stack-config job as a PyTorchJob, MPIJob or TrainJob, and a pool's
ClusterTrainingRuntime for self-service TrainJobs. Pure functions, no Pulumi.

Every training pod, a stack job's or a runtime's, comes from one function (pod_template) over one
value (TrainingPods): pool placement, GPU and EFA requests, /dev/shm, the shared file systems,
the Pod Identity service account, Pod Security restricted, the grace period. The same trainer
arguments feed the cluster manifests and the local twin (workloads/local.py).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infra.core.pools import Pool
from infra.hybrid.placement import pod_placement
from infra.jobs.config import DEFAULT_MAX_RESTARTS, SELF_SERVICE_ACCOUNT, JobConfig
from infra.kueue.queues import PREFERRED_TOPOLOGY_LEVEL
from infra.storage.lustre import CHECKPOINTS_CLAIM as FSX_CHECKPOINTS_CLAIM
from infra.storage.lustre import DATASETS_CLAIM as FSX_DATASETS_CLAIM
from infra.storage.shared_file_system import CLAIM as EFS_CLAIM
from trainer import RESTRICTED_CONTAINER, RESTRICTED_POD, TRAINER_UID
from trainer.user_code import INPUT_ERROR

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TRAINER_GROUP = "trainer.kubeflow.org"
API_VERSIONS = {
    "PyTorchJob": "kubeflow.org/v1",
    "MPIJob": "kubeflow.org/v2beta1",
    "TrainJob": f"{TRAINER_GROUP}/v1alpha1",
    "ClusterTrainingRuntime": f"{TRAINER_GROUP}/v1alpha1",
}
JOB_LABEL = "training-platform/job"
# torchrun through trainer.launch, which hands the kubelet's SIGTERM to the workers (exit 0).
LAUNCH = ["python", "-m", "trainer.launch", "-m", "trainer"]


@dataclass(frozen=True)
class Mount:
    """A claim of a team namespace as its pods mount it."""

    volume: str
    claim: str
    path: str
    read_only: bool = False


# The shared file systems' claims, by store. The first of each holds the jobs' checkpoints, in
# <its path>/checkpoints (EFS) or at its path (FSx: the team's own directory, infra/components/
# lustre.py); FSx's datasets are read-only.
MOUNTS = {
    "efs": (Mount("efs", EFS_CLAIM, "/efs"),),
    "fsx": (
        Mount("fsx-checkpoints", FSX_CHECKPOINTS_CLAIM, "/fsx/checkpoints"),
        Mount("fsx-datasets", FSX_DATASETS_CLAIM, "/fsx/datasets", read_only=True),
    ),
}
CHECKPOINT_ROOTS = {"efs": "/efs/checkpoints", "fsx": "/fsx/checkpoints"}
RDZV_PORT = 29500
# Pods get this long after SIGTERM; the trainer saves a checkpoint and exits well inside it.
GRACE_SECONDS = 120
# The MPI launcher's container (mpirun, no training) and what it asks for.
LAUNCHER = "launcher"
LAUNCHER_REQUESTS = {"cpu": "1", "memory": "2Gi"}
# Pod Security "restricted" for every training pod; volumes that honour fsGroup (EBS, EFS access
# points) are group-writable for the trainer. Its containers need no capability (MPI workers'
# sshd listens on 2222 as `trainer`).
POD_SECURITY = {**RESTRICTED_POD, "fsGroup": TRAINER_UID}
# What mpirun hands its ranks besides the launcher's own pod env. A worker's sshd starts orted
# with sshd's default environment (PATH=/usr/local/bin:/usr/bin:/bin..., where Debian's and
# Ubuntu's openmpi-bin put orted; no LD_LIBRARY_PATH), and orted gives a rank only what mpirun
# exports with -x (OpenMPI 4.1: orte/mca/schizo/ompi/schizo_ompi.c), looking the program up on
# that PATH (orte/util/context_fns.c). mpi-operator's examples pass `-x PATH -x LD_LIBRARY_PATH`.
# From the image: python is in /opt/conda/bin, the efa target's aws-ofi-nccl plugin is found
# through LD_LIBRARY_PATH. From EKS Pod Identity, which injects them into every pod of the job's
# service account (workers mount the same token path): the credentials for S3 checkpoints, only
# where the pods have an identity: mpirun warns of every -x variable the launcher lacks, into
# the log.
IMAGE_ENV = ("PATH", "LD_LIBRARY_PATH")
POD_IDENTITY_ENV = ("AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")
# libfabric/NCCL settings for EFA (aws-ofi-nccl ships in the AWS and NVIDIA CUDA images).
EFA_ENV = {
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "FI_EFA_FORK_SAFE": "1",
    "NCCL_DEBUG": "WARN",
}


# On a pool Kueue places by topology, every pod set must ask for topology (Kueue admits no
# other pods onto its flavor): the ranks prefer one bottom-layer network node, the MPI launcher
# only needs room somewhere. Annotation names: kueue apis/kueue/v1beta2/topology_types.go.
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
UNCONSTRAINED_TOPOLOGY = "kueue.x-k8s.io/podset-unconstrained-topology"


def topology_annotations(pool: Pool, ranks: bool) -> dict[str, str]:
    if not pool.topology:
        return {}
    if ranks:
        return {PREFERRED_TOPOLOGY: PREFERRED_TOPOLOGY_LEVEL}
    return {UNCONSTRAINED_TOPOLOGY: "true"}


def s3_checkpoint_dir(bucket: str, namespace: str, name: str) -> str:
    """A job's checkpoints in S3: under its namespace's prefix, which its pods' role may use."""
    return f"s3://{bucket}/checkpoints/{namespace}/{name}"


def checkpoint_dir(job: JobConfig, namespace: str, bucket: str) -> str:
    if job.checkpoint == "s3":
        return s3_checkpoint_dir(bucket, namespace, job.name)
    return mounted_checkpoint_dir(job)


def mounted_checkpoint_dir(job: JobConfig) -> str:
    return f"{CHECKPOINT_ROOTS[job.checkpoint]}/{job.name}"


def trainer_args(job: JobConfig, checkpoint: str) -> list[str]:
    return [*job.args, "--checkpoint-dir", checkpoint]


def _resources(pool: Pool) -> dict:
    """Requests Kueue charges against quota and the scheduler places by; never BestEffort."""
    cpu, memory_gib = pool.job_pod_requests()
    limits = {"memory": f"{memory_gib}Gi"}
    if not pool.gpu and not pool.hybrid:
        # CPU pods share their nodes: the limit keeps one job from starving its neighbours. The
        # Kubeflow SDK also reads a runtime's device from its limits, and refuses limits that
        # name no cpu or accelerator (kubeflow 0.4.0 and 0.5.0, trainer/backends/kubernetes/
        # utils.py get_container_devices).
        limits["cpu"] = str(cpu)
    if pool.gpu:
        # The pod asks for every GPU (and EFA interface) of the node: one pod per node.
        limits["nvidia.com/gpu"] = str(pool.gpus_per_node)
    if pool.efa:
        limits["vpc.amazonaws.com/efa"] = str(pool.efa_network_cards)
    return {"requests": {"cpu": str(cpu), **limits}, "limits": limits}


def checkpoint_dir_init(image: str, directory: str) -> dict:
    """An init container that creates the job's checkpoint folder on FSx for the trainer's uid.

    A team's directory on Lustre, made by FSx when it imports the team's marker object, belongs
    to root (0755), and Lustre has no access points, so the non-root trainer could not create its
    folder. This runs as root with CHOWN and DAC_OVERRIDE only and
    touches nothing but the job's own folder.
    """
    return {
        "name": "checkpoint-dir",
        "image": image,
        "command": [
            "sh",
            "-c",
            f'mkdir -p "{directory}" && chown {TRAINER_UID}:{TRAINER_UID} "{directory}"',
        ],
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE"]},
        },
        "volumeMounts": [{"name": MOUNTS["fsx"][0].volume, "mountPath": MOUNTS["fsx"][0].path}],
    }


@dataclass(frozen=True)
class TrainingPods:
    """What every training pod on a pool carries besides its command: the one value behind a
    stack job's pods and a pool's ClusterTrainingRuntime."""

    pool: Pool
    image: Any  # a reference by digest, or a Pulumi Output left as a leaf
    storage: frozenset[str]  # shared file systems mounted into the pods: fsx, efs
    service_account: str  # the one its Pod Identity association names
    labels: Mapping[str, str] = field(default_factory=dict)
    fsx_folder: str | None = None  # created for the trainer's uid before it starts


@dataclass(frozen=True)
class JobTarget:
    """A job from stack config and where it runs: everything its manifests are rendered from."""

    job: JobConfig
    pool: Pool
    namespace: str
    image: Any  # a reference by digest, or a Pulumi Output left as a leaf (see TrainingJob)
    checkpoint: str  # where the trainer writes checkpoints (s3://..., /fsx/..., /efs/...)
    storage: frozenset[str]  # shared file systems mounted into the pods: fsx, efs
    # The pods' ServiceAccount; None: the job's own, named after it (its Pod Identity role).
    service_account_name: str | None = None
    # What the pods run; None: the platform's trainer with the job's arguments. A user's own
    # code (workloads.user_job) runs through trainer.user_code.
    program: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()  # the program's own variables, after the platform's

    @property
    def command(self) -> list[str]:
        if self.program:
            return list(self.program)
        return [*LAUNCH, *trainer_args(self.job, self.checkpoint)]

    @property
    def service_account(self) -> str:
        return self.service_account_name or self.job.name

    @property
    def pod_identity(self) -> bool:
        """Only a job's own ServiceAccount has a Pod Identity association (TrainingJob)."""
        return self.service_account_name is None

    @property
    def pods(self) -> TrainingPods:
        job = self.job
        return TrainingPods(
            self.pool,
            self.image,
            self.storage,
            self.service_account,
            {JOB_LABEL: job.name},
            mounted_checkpoint_dir(job) if job.checkpoint == "fsx" else None,
        )


def pod_template(
    pods: TrainingPods,
    container: str,
    command: list[str],
    env: list[dict] = (),
    with_resources: bool = True,
) -> dict:
    """A training pod: `container` runs `command` with `env` after the platform's own; without
    resources, a small pod beside the ranks (the MPI launcher)."""
    pool, image = pods.pool, pods.image
    own_env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if pool.efa and with_resources:
        own_env += [{"name": k, "value": v} for k, v in EFA_ENV.items()]
    volumes = [
        {
            "name": "dshm",
            "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi" if pool.gpu else "2Gi"},
        }
    ]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    for mount in (m for kind in sorted(pods.storage) for m in MOUNTS[kind]):
        read_only = {"readOnly": True} if mount.read_only else {}
        claim = {"claimName": mount.claim, **read_only}
        volumes.append({"name": mount.volume, "persistentVolumeClaim": claim})
        mounts.append({"name": mount.volume, "mountPath": mount.path, **read_only})
    spec = {
        "serviceAccountName": pods.service_account,
        # Pod Identity mounts its own projected token (eks-pod-identity-token); the pods never
        # call the Kubernetes API, so they get no API token.
        "automountServiceAccountToken": False,
        "securityContext": POD_SECURITY,
        **pod_placement(pool),
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "containers": [
            {
                "name": container,
                "image": image,
                "command": command,
                "env": [*own_env, *env],
                "volumeMounts": mounts,
                "securityContext": RESTRICTED_CONTAINER,
                "resources": _resources(pool)
                if with_resources
                else {
                    "requests": LAUNCHER_REQUESTS,
                    "limits": {"memory": LAUNCHER_REQUESTS["memory"]},
                },
            }
        ],
        "volumes": volumes,
    }
    if pods.fsx_folder:
        spec["initContainers"] = [checkpoint_dir_init(image, pods.fsx_folder)]
    metadata = {"labels": dict(pods.labels)} if pods.labels else {}
    metadata["annotations"] = {
        # Karpenter must not consolidate a node away under a running job.
        "karpenter.sh/do-not-disrupt": "true",
        **topology_annotations(pool, ranks=with_resources),
    }
    return {"metadata": metadata, "spec": spec}


def _env(pairs) -> list[dict]:
    return [{"name": name, "value": value} for name, value in pairs]


def network_policy(job: JobConfig, namespace: str) -> dict:
    """Ingress to the job's pods only from the job's own pods (MPI's sshd, torch rendezvous)."""
    own_pods = {"matchLabels": {JOB_LABEL: job.name}}
    return {
        "metadata": {"name": f"{job.name}-own-pods", "namespace": namespace},
        "spec": {
            "podSelector": own_pods,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": own_pods}]}],
        },
    }


def _metadata(job: JobConfig, namespace: str) -> dict:
    return {
        "name": job.name,
        "namespace": namespace,
        "labels": {QUEUE_LABEL: job.queue, JOB_LABEL: job.name},
    }


def _run_policy(job: JobConfig) -> dict:
    # No ttlSecondsAfterFinished: a job in stack config exists for as long as it is there, finished
    # or not. Were the operator to delete a finished job, the next `pulumi up --refresh` would see
    # it gone and create it again, re-running (and billing) the training. Remove the job from
    # stack config to delete it.
    return {"backoffLimit": job.max_restarts, "cleanPodPolicy": "None"}


def pytorch_job(target: JobTarget) -> dict:
    """Elastic PyTorchJob: torchrun reads nodes, rendezvous and restarts from the operator's env."""
    job, pool = target.job, target.pool
    return {
        "apiVersion": API_VERSIONS["PyTorchJob"],
        "kind": "PyTorchJob",
        "metadata": _metadata(job, target.namespace),
        "spec": {
            "nprocPerNode": str(pool.procs_per_node),
            "elasticPolicy": {
                "rdzvBackend": "c10d",
                "minReplicas": job.min_nodes,
                "maxReplicas": job.max_nodes,
                "maxRestarts": job.max_restarts,
            },
            "runPolicy": _run_policy(job),
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": job.max_nodes,
                    # A user's code ends with exit 2 on input no restart fixes (trainer.
                    # user_code): ExitCode fails the job on 1-127 and restarts on 128-255 (a
                    # kill), kubeflow/trainer release-1.9 pkg/apis/kubeflow.org/v1/common_types.go.
                    "restartPolicy": "ExitCode" if target.program else "OnFailure",
                    "template": pod_template(
                        target.pods, "pytorch", target.command, _env(target.env)
                    ),
                }
            },
        },
    }


def mpi_job(
    target: JobTarget,
    program: list[str] | None = None,
    env: dict[str, str] | None = None,
    launcher_restart_policy: str = "OnFailure",
) -> dict:
    """MPIJob: the launcher runs `program` (default: the job's trainer) through mpirun, `slots`
    processes per worker, with `env` over the launcher's own variables (all forwarded to ranks).

    `launcher_restart_policy`: OnFailure restarts a failed mpirun in its pod, up to the run
    policy's backoffLimit (a job's maxRestarts); Never leaves a failed launcher pod, and its log,
    as it ended (the fabric check, whose log is its result).
    """
    job, pool, namespace = target.job, target.pool, target.namespace
    slots = pool.procs_per_node
    # The MPI operator names workers <job>-worker-<i> behind the headless service <job>.
    master = f"{job.name}-worker-0.{job.name}.{namespace}.svc"
    env = {
        "MASTER_ADDR": master,
        "MASTER_PORT": str(RDZV_PORT),
        **(EFA_ENV if pool.efa else {}),
        **(env or {}),
    }
    launcher = pod_template(target.pods, LAUNCHER, [], _env(target.env), with_resources=False)
    container = launcher["spec"]["containers"][0]
    container["env"] += _env(env.items())
    identity = POD_IDENTITY_ENV if target.pod_identity else ()
    exported = [*IMAGE_ENV, *identity, *(e["name"] for e in container["env"])]
    container["command"] = [
        "mpirun",
        "-np",
        str(job.max_nodes * slots),
        "--map-by",
        f"ppr:{slots}:node",
        "--bind-to",
        "none",
        *[a for name in exported for a in ("-x", name)],
        *(
            program
            or target.program
            or ["python", "-m", "trainer", *trainer_args(job, target.checkpoint)]
        ),
    ]
    # sshd as the image's non-root user, with the config trainer/Dockerfile writes.
    sshd = ["/usr/sbin/sshd", "-De", "-f", "/home/trainer/.sshd_config"]
    worker = pod_template(target.pods, "worker", sshd)
    return {
        "apiVersion": API_VERSIONS["MPIJob"],
        "kind": "MPIJob",
        "metadata": _metadata(job, namespace),
        "spec": {
            "slotsPerWorker": slots,
            "mpiImplementation": "OpenMPI",
            "launcherCreationPolicy": "WaitForWorkersReady",
            # The image runs as the non-root user `trainer`; its SSH keys go to its home.
            "sshAuthMountPath": "/home/trainer/.ssh",
            "runPolicy": _run_policy(job),
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": launcher_restart_policy,
                    "template": launcher,
                },
                "Worker": {
                    "replicas": job.max_nodes,
                    "restartPolicy": "OnFailure",
                    "template": worker,
                },
            },
        },
    }


# Kubeflow Trainer v2.3.0's runtime contract (infra/operators/tests/trainer_rules.py): the trainer's
# replicated job and container are named `node`, the replicated job is labelled as the trainer step,
# and the SDK lists only runtimes labelled with their framework. JobSet names every pod's JobSet,
# i.e. its TrainJob, in a label.
NODE = "node"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
# Where the trainer writes checkpoints: the runtime's S3 default under the job's namespace, which
# the team's role may use; a TrainJob may set it (spec.trainer.env) to /efs/... instead.
CHECKPOINT_ENV = "CHECKPOINT_DIR"
# The owner of the stack's own patch on a TrainJob from stack config (spec.runtimePatches).
STACK_PATCH_MANAGER = "training-platform.io/stack"


# How the Job of a runtime's nodes takes a failed pod (Kubernetes' Job podFailurePolicy, rules in
# order): input no restart fixes (trainer.launch and trainer.user_code exit 2: no snapshot,
# requirements that do not install, a script that does not compile) fails the job at once; a
# pod evicted or preempted (a drain, a Spot interruption: condition DisruptionTarget) is
# replaced without counting against backoffLimit; any other failure counts.
POD_FAILURE_POLICY = {
    "rules": [
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": NODE, "operator": "In", "values": [INPUT_ERROR]},
        },
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
    ]
}


def runtime_name(pool: Pool) -> str:
    """The ClusterTrainingRuntime of a pool, which TrainJobs name to run there."""
    return f"torch-{pool.name}"


def training_runtime(pool: Pool, image: Any, storage: frozenset[str], bucket: str) -> dict:
    """The pool's ClusterTrainingRuntime: PyTorch (torchrun from the Trainer's PET_* variables)
    in the pods a stack job on the pool gets, run as the team's self-service identity, with
    checkpoints in S3 under the job's namespace (its name and namespace from the downward API;
    Kubernetes expands $(VAR) in env values and in the command)."""
    env = [
        {
            "name": "TRAINJOB_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOBSET_NAME_LABEL}']"}},
        },
        {
            "name": "TRAINJOB_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
        {
            "name": CHECKPOINT_ENV,
            "value": s3_checkpoint_dir(bucket, "$(TRAINJOB_NAMESPACE)", "$(TRAINJOB_NAME)"),
        },
    ]
    pods = TrainingPods(pool, image, storage, SELF_SERVICE_ACCOUNT)
    command = [*LAUNCH, "--checkpoint-dir", f"$({CHECKPOINT_ENV})"]
    template = pod_template(pods, NODE, command, env)
    # A failed node gets a new pod, at most as often as a stack job's default maxRestarts; a pod
    # failure policy needs restartPolicy Never (the Job API's validation).
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": API_VERSIONS["ClusterTrainingRuntime"],
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": runtime_name(pool), "labels": {FRAMEWORK_LABEL: "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": NODE,
                            "template": {
                                "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                                "spec": {
                                    "backoffLimit": DEFAULT_MAX_RESTARTS,
                                    "podFailurePolicy": POD_FAILURE_POLICY,
                                    "template": template,
                                },
                            },
                        }
                    ]
                }
            },
        },
    }


def train_job(target: JobTarget) -> dict:
    """A TrainJob on its pool's runtime: the job's image, arguments, nodes and checkpoints; its
    own identity and label on the runtime's pods (a runtime patch of the stack's own)."""
    job, pool, pods = target.job, target.pool, target.pods
    own = {
        "metadata": {"labels": dict(pods.labels)},
        "spec": {"serviceAccountName": pods.service_account},
    }
    patch = {"replicatedJobs": [{"name": NODE, "template": {"spec": {"template": own}}}]}
    return {
        "apiVersion": API_VERSIONS["TrainJob"],
        "kind": "TrainJob",
        "metadata": _metadata(job, target.namespace),
        "spec": {
            "runtimeRef": {
                "name": runtime_name(pool),
                "kind": "ClusterTrainingRuntime",
                "apiGroup": TRAINER_GROUP,
            },
            "trainer": {
                "image": target.image,
                **({"command": target.command} if target.program else {"args": list(job.args)}),
                # A program's own CHECKPOINT_DIR (a stack job's command) is the same folder.
                "env": _env({CHECKPOINT_ENV: target.checkpoint, **dict(target.env)}.items()),
                "numNodes": job.max_nodes,
                "numProcPerNode": pool.procs_per_node,
            },
            "runtimePatches": [
                {
                    "manager": STACK_PATCH_MANAGER,
                    "trainingRuntimeSpec": {"template": {"spec": patch}},
                }
            ],
        },
    }
