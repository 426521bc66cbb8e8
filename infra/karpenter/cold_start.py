"""How long a pod waits on a cold node, per pool, and the Kueue timeouts that follow from it.

A job or DevServer pod on a pool with no free node waits for, in turn:
  launch  EC2 starts the instance, nodeadm joins it, the node turns Ready and (GPU pools) the
          NVIDIA device plugin advertises its GPUs;
  pull    the node pulls the trainer image from ECR: download over the network, then unpack
          (decompress and write) onto containerd's disk;
  start   the trainer process starts (python, torch, CUDA and NCCL initialization).
Each figure below names where it comes from; the ones marked "assumption" had no published figure
we could read and are what to replace first with a cluster's own measurement (Karpenter's
`karpenter_pods_startup_duration_seconds` histogram: pod creation to running, the launch and pull
together). Kueue's waitForPodsReady timeouts (infra/kueue/kueue.py) are derived from the
slowest pool, so a slower instance type, a bigger image or a slower disk moves them.
"""

import math
from dataclasses import dataclass

from infra.core.catalog import InstanceType
from infra.core.pools import image_target
from infra.karpenter.config import NodePoolConfig


@dataclass(frozen=True)
class Figure:
    value: float
    source: str


@dataclass(frozen=True)
class ImageSize:
    compressed_gb: float
    unpacked_gb: float
    source: str


# The trainer image per Dockerfile target. The base image pytorch/pytorch:<torch>-cuda13.0-cudnn9-
# runtime puts its whole Python environment (torch and its CUDA, cuDNN, NCCL, cuBLAS wheels) in one
# layer: its Dockerfile's `official` stage is ubuntu, one apt layer and `COPY --from=conda-installs
# /opt/conda /opt/conda` (pytorch/pytorch, Dockerfile). One layer decompresses as one stream, so the
# model unpacks the image as one stream.
IMAGES = {
    "runtime": ImageSize(
        3.6,
        8.3,
        "estimate, not measured here (no registry access): 3.5 GB compressed / 8 GB unpacked "
        "assumed for the base image, plus our apt, pip and code layers (0.1 / 0.3 GB); measure "
        "with `docker buildx imagetools inspect --raw <ref>` (sum of layers[].size)",
    ),
    "efa": ImageSize(
        3.9,
        9.2,
        "runtime plus the AWS EFA installer layer (libfabric, Open MPI, aws-ofi-nccl): 0.3 / 0.9 "
        "GB assumed",
    ),
}
# EC2 gives two minutes between a Spot interruption warning and reclaiming the instance; Karpenter
# starts the replacement node when it sees the warning (Karpenter docs, concepts/disruption.md,
# "Interruption").
SPOT_NOTICE_S = Figure(120, "EC2 Spot interruption notice (Karpenter docs, Interruption)")
# Instance launch to node Ready. Karpenter's docs say its average node startup generally fits in
# the two-minute Spot notice (concepts/disruption.md, "Interruption"): 90 s for single-socket G and
# CPU types. P types (8 GPUs, NVSwitch, up to 32 EFA interfaces, 1-2 TiB of memory) take minutes
# more to boot and bring up the GPU fabric.
LAUNCH_S = Figure(90, "Karpenter docs: average node startup fits the 2-minute Spot notice")
P_FAMILY_LAUNCH_S = Figure(300, "assumption: 8-GPU P instances boot in about 5 minutes")
# The NVIDIA device plugin DaemonSet's pod is pulled and started on the new node and registers
# nvidia.com/gpu with the kubelet; only then can a GPU pod be scheduled there.
GPU_ADVERTISE_S = Figure(30, "assumption: device plugin image pull, start and registration")
# One HTTP connection to ECR: "A single connection to ECR often sustains only a few hundred Mbps"
# (awslabs/data-on-eks, website/docs/bestpractices/analytics/soci-spark-image-pulls.md): 300 Mbps.
ECR_STREAM_MBPS = Figure(37.5, "data-on-eks SOCI guide: a few hundred Mbps per ECR connection")
# nodeadm's FastImagePull feature gate runs the SOCI snapshotter in parallel pull mode with 20
# connections per image (nodeadm/internal/containerd/snapshotter/soci-snapshotter.config.toml,
# max_concurrent_downloads_per_image = 20), and only on nodes with at least 4 vCPU and 7 GiB
# (nodeadm/internal/containerd/config.go, UseSOCISnapshotter). Without it containerd fetches a
# layer over one connection.
FAST_PULL_STREAMS = Figure(20, "nodeadm soci-snapshotter.config.toml")
FAST_PULL_MIN_VCPU, FAST_PULL_MIN_MEMORY_GIB = 4, 7
# Decompressing one gzip layer is one stream whatever the download did (data-on-eks SOCI guide:
# "Decompression of a single layer is one stream").
INFLATE_MBPS = Figure(300, "assumption: one gzip stream (unpigz -d) writes about 300 MB/s")
# AWS publishes instance-store IOPS, not sequential write throughput, for these NVMe disks.
NVME_WRITE_MBPS = Figure(1000, "assumption: 1 GB/s sequential write per NVMe instance-store disk")
PROCESS_START_S = Figure(30, "assumption: python, torch import, CUDA and NCCL initialization")
# Headroom over the modelled cold start: a timeout that fires on a normal start evicts a job that
# was about to run, and the model's assumptions may be off by that much.
MARGIN = 1.5
# A stack with no pool to launch (hybrid machines only) still pulls and starts.
MIN_TIMEOUT_S = 300


@dataclass(frozen=True)
class ColdStart:
    """One pool's cold start on its slowest instance type."""

    pool: str
    instance_type: str
    disk: str  # where containerd unpacks the image
    fast_pull: bool  # nodeadm's FastImagePull applies (instance large enough)
    launch_s: float
    pull_s: float
    start_s: float

    @property
    def total_s(self) -> float:
        return self.launch_s + self.pull_s + self.start_s


def fast_image_pull(instance: InstanceType) -> bool:
    return instance.vcpu >= FAST_PULL_MIN_VCPU and instance.memory_gib >= FAST_PULL_MIN_MEMORY_GIB


def launch_seconds(instance: InstanceType) -> float:
    boot = P_FAMILY_LAUNCH_S if instance.name.startswith("p") else LAUNCH_S
    return boot.value + (GPU_ADVERTISE_S.value if instance.gpus else 0)


def disk_write(pool: NodePoolConfig, instance: InstanceType) -> tuple[str, float]:
    """(description, MB/s) of the disk containerd unpacks onto on `instance` in `pool`."""
    if pool.instance_store:
        disks = instance.nvme_disks
        return (
            f"NVMe RAID0 {disks} x {instance.nvme_gb_per_disk} GB",
            disks * NVME_WRITE_MBPS.value,
        )
    mibps = pool.root_throughput_mibps()
    return f"gp3 {mibps} MiB/s", mibps * 1.048576


def pull_seconds(image: ImageSize, pool: NodePoolConfig, instance: InstanceType) -> float:
    """Download at the rate the connections and the node's network allow, then unpack at the
    rate one decompression stream and the disk allow."""
    streams = FAST_PULL_STREAMS.value if fast_image_pull(instance) else 1
    download_mbps = min(instance.network_gbps * 125, streams * ECR_STREAM_MBPS.value)
    unpack_mbps = min(disk_write(pool, instance)[1], INFLATE_MBPS.value)
    return image.compressed_gb * 1000 / download_mbps + image.unpacked_gb * 1000 / unpack_mbps


def cold_start(pool: NodePoolConfig) -> ColdStart:
    image = IMAGES[image_target(pool)]
    starts = [
        ColdStart(
            pool=pool.name,
            instance_type=instance.name,
            disk=disk_write(pool, instance)[0],
            fast_pull=fast_image_pull(instance),
            launch_s=launch_seconds(instance),
            pull_s=pull_seconds(image, pool, instance),
            start_s=PROCESS_START_S.value,
        )
        for instance in pool.types
    ]
    return max(starts, key=lambda s: (s.total_s, s.instance_type))


@dataclass(frozen=True)
class PodsReadyTimeouts:
    """Kueue waitForPodsReady durations, whole minutes, and the cold start they come from."""

    timeout_s: int
    recovery_timeout_s: int
    slowest: ColdStart | None


def _whole_minutes(seconds: float) -> int:
    return math.ceil(seconds / 60) * 60


def pods_ready_timeouts(pools: list[NodePoolConfig]) -> PodsReadyTimeouts:
    """timeout: the slowest pool's cold start with MARGIN, so no pod that is merely starting is
    evicted. recoveryTimeout: a Spot replacement of that pool (the notice, then a cold start of the
    new node) with MARGIN, so one interruption does not evict a whole elastic job."""
    slowest = max((cold_start(p) for p in pools), key=lambda s: s.total_s, default=None)
    cold = slowest.total_s if slowest else 0
    return PodsReadyTimeouts(
        timeout_s=_whole_minutes(max(cold * MARGIN, MIN_TIMEOUT_S)),
        recovery_timeout_s=_whole_minutes((SPOT_NOTICE_S.value + cold) * MARGIN),
        slowest=slowest,
    )


def duration(seconds: float) -> str:
    """`6m33s`, as Go's time.Duration and Kubernetes' metav1.Duration read it."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest}s" if rest else f"{minutes}m"
