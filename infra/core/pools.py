"""What a pool is to everything that places pods on it, whichever integration makes its nodes:
a Karpenter NodePool (infra/karpenter/config.py NodePoolConfig) or the hybrid machines
(infra/hybrid/config.py HybridPool). Jobs, queues, runtimes and DevServer flavors size and place
their pods through this contract alone."""

import math
from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel


class Machine(Protocol):
    """A node a pod may have to itself: an EC2 instance type, or a hybrid machine."""

    @property
    def vcpu(self) -> int: ...

    @property
    def memory_gib(self) -> float: ...


def pod_room(node: Machine) -> tuple[int, int]:
    """(vCPU, GiB of memory) a pod may request and still fit alone on this node.

    What the node keeps: EC2's memory overhead (Karpenter assumes 7.5 %), the kubelet's
    reservations and eviction threshold, and the DaemonSets (CNI, kube-proxy, CSI and device
    plugins, GPU metrics): 10 % of the vCPUs (at least one) and 15 % of the memory.
    """
    vcpu, memory_gib = node.vcpu, node.memory_gib
    return min(vcpu - 1, math.floor(vcpu * 0.9)), math.floor(memory_gib * 0.85)


def smallest_room(nodes: Sequence[Machine]) -> tuple[int, int]:
    """(vCPU, GiB) a pod may request and fit alone on any of `nodes` (pod_room of each)."""
    rooms = [pod_room(n) for n in nodes]
    return min(vcpu for vcpu, _ in rooms), min(memory for _, memory in rooms)


class PoolCeiling(BaseModel):
    """The most a pool can ever hold; Karpenter limits and Kueue quotas both come from it."""

    nodes: int
    gpus: int
    vcpu: int
    memory_gib: int


def processes_per_node(pool: "Pool") -> int:
    """Trainer processes per node: one per GPU; one on CPU nodes (gloo)."""
    return pool.gpus_per_node if pool.gpu else 1


class Pool(Protocol):
    """A pool as jobs, queues and flavors read it."""

    @property
    def name(self) -> str: ...

    @property
    def hybrid(self) -> bool: ...

    @property
    def efa(self) -> bool: ...

    @property
    def efa_network_cards(self) -> int: ...

    @property
    def topology(self) -> bool: ...

    @property
    def max_nodes(self) -> int: ...

    @property
    def gpu(self) -> bool: ...

    @property
    def gpus_per_node(self) -> int: ...

    @property
    def procs_per_node(self) -> int: ...

    def job_pod_requests(self) -> tuple[int, int]: ...

    def ceiling(self) -> PoolCeiling: ...


def image_target(pool: Pool) -> str:
    """The trainer image's Dockerfile target a job on `pool` runs (trainer/Dockerfile): NCCL over
    EFA needs libfabric and aws-ofi-nccl, which only the `efa` target ships."""
    return "efa" if pool.efa else "runtime"
