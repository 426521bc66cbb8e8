"""`nodePools`: Karpenter NodePools, their ceilings (the one knob behind limits, quotas and cost),
capacity reservations, and the room a pod may ask of a node."""

from typing import ClassVar, Literal

from pydantic import (
    Field,
    model_validator,
)

from infra.core.catalog import (
    InstanceType,
    load_catalog,
    load_published_busbw,
)
from infra.core.config import Duration, InstanceTypeName, K8sName, Model, hours
from infra.core.pools import PoolCeiling, processes_per_node, smallest_room
from infra.karpenter.fabric_check import (
    FABRIC_DEFAULT_MAX_BYTES,
    PUBLISHED_FLOOR_SHARE,
    BusbwFloor,
    FabricCheckConfig,
    FabricCheckPlan,
    fabric_sizes,
)

# Bounds of a node's lifetime (expireAfter): under an hour nodes churn under running jobs; over
# 90 days they miss the AMI patches that only replacement brings.
EXPIRE_AFTER_HOURS = (1, 2160)


# gp3 root volume throughput (MiB/s) by whether the pool's nodes have NVMe instance store. Without
# it, images unpack onto the root volume: nodeadm's FastImagePull guide asks for at least 600 MiB/s
# (awslabs/amazon-eks-ami nodeadm/doc/examples.md, "Enabling fast image pull"); gp3's baseline 125
# MiB/s would make the disk the bottleneck of every cold start. With it, the root volume holds only
# the OS and gets gp3's baseline, which costs nothing extra.
ROOT_THROUGHPUT_MIBPS = {False: 600, True: 125}


class CapacityReservation(Model):
    """EC2 capacity bought ahead that a pool launches into first (Karpenter's `reserved` capacity
    type): an On-Demand Capacity Reservation (`default`) or a Capacity Block for ML
    (`capacity-block`), selected by id or by tags. Type and count are what the plan prices and
    deploy.preflight checks against AWS."""

    id: str | None = Field(
        default=None,
        pattern=r"^cr-[0-9a-z]+$",
        description="One reservation by id (cr-...); give id or tags, not both.",
    )
    tags: dict[str, str] | None = Field(
        default=None,
        min_length=1,
        max_length=20,
        description="Every reservation carrying all these tags, non-empty keys and values; "
        "'*' matches any value (Karpenter's semantics).",
    )
    reservation_type: Literal["default", "capacity-block"] = Field(
        default="default",
        description="An On-Demand Capacity Reservation (default) or a Capacity Block for ML.",
    )
    instance_type: InstanceTypeName = Field(
        description="Its instance type: one of the pool's instanceTypes."
    )
    instance_count: int = Field(
        ge=1,
        le=1000,
        description="Instances it holds: what the plan prices as a fixed baseline line, and "
        "what deploy.preflight checks against AWS.",
    )
    duration_hours: int | None = Field(
        default=None,
        ge=24,
        le=182 * 24,
        description="A Capacity Block's length in hours (required for blocks): EC2 sells blocks "
        "of 1 to 14 days, then in weeks up to 182 days. The plan prices a block as paid up front "
        "for its length.",
    )
    upfront_fee_usd: float | None = Field(
        default=None,
        gt=0,
        description="What the block cost (DescribeCapacityBlockOfferings' UpfrontFee); default: "
        "the region's published block rate.",
    )

    @model_validator(mode="after")
    def _one_selector(self) -> "CapacityReservation":
        block = self.reservation_type == "capacity-block"
        if block and self.duration_hours is None:
            raise ValueError(
                "a capacity-block reservation needs durationHours (the block's length, paid up "
                "front); allowed: 24 to 4368"
            )
        if not block and (self.duration_hours is not None or self.upfront_fee_usd is not None):
            raise ValueError(
                "durationHours and upfrontFeeUsd are set on an On-Demand Capacity Reservation, "
                "which bills per hour while held; allowed: only with reservationType "
                "capacity-block"
            )
        if (self.id is None) == (self.tags is None):
            raise ValueError(
                "needs id or tags, not both and not neither; allowed: id: cr-... (one "
                "reservation) or tags: {key: value} (every reservation carrying them)"
            )
        if self.tags and any(key == "" or value == "" for key, value in self.tags.items()):
            raise ValueError(
                "tags has an empty key or value, which Karpenter's EC2NodeClass refuses; "
                "allowed: non-empty keys and values ('*' for any value)"
            )
        return self

    def selector_term(self) -> dict:
        """The EC2NodeClass capacityReservationSelectorTerms entry that selects it."""
        return {"id": self.id} if self.id else {"tags": dict(self.tags or {})}


class NodePoolConfig(Model):
    """A Karpenter NodePool. GPU or CPU follows from its instance types, which may not mix."""

    hybrid: ClassVar[bool] = False  # what the jobs and flavors on it read (HybridPool: True)

    name: K8sName = Field(
        description="The NodePool's name; also its Kueue ResourceFlavor. Not `hybrid` (the "
        "hybrid machines' pool)."
    )
    instance_types: list[InstanceTypeName] = Field(
        min_length=1,
        description="Instance types of infra/core/catalog/instance_types.yaml, all GPU or all CPU; "
        "with efa, every one with EFA. A CPU pool's types must hold a job pod (2 vCPU, 8 GiB "
        "plus node reserve).",
    )
    max_nodes: int = Field(
        ge=1,
        le=1000,
        description="The one knob for capacity: the pool's Karpenter limits (nodes, "
        "nvidia.com/gpu, cpu, memory = maxNodes x the largest type's figures), its flavor's "
        "quota in the platform ClusterQueue, and the plan's cost ceiling follow from it.",
    )
    capacity_types: list[Literal["on-demand", "spot", "reserved"]] = Field(
        default=["on-demand"],
        min_length=1,
        description="Karpenter capacity types, each once; `reserved` launches into "
        "capacityReservations first and needs them.",
    )
    capacity_reservations: list[CapacityReservation] = Field(
        default_factory=list,
        max_length=30,
        description="Capacity bought ahead (ODCRs, Capacity Blocks) the pool launches into "
        "first; at most 30 (Karpenter's selector terms). Needs `reserved` in capacityTypes; "
        "their instances may not exceed maxNodes, and a reserved-only pool's maxNodes is their "
        "count.",
    )
    static_nodes: bool = Field(
        default=False,
        description="Karpenter keeps maxNodes nodes running (a static NodePool) whether or not "
        "a job runs. With EC2-topology types (p4d, p4de, p5, p5e, p5en, g6e) Kueue then places "
        "jobs by network topology; no DevServer flavor may use such a pool. Changing it on an "
        "existing pool needs the pool removed and added back.",
    )
    efa: bool = Field(
        default=False,
        description="EFA interfaces on every node, the EFA device plugin, a cluster placement "
        "group in one AZ, and the image's `efa` target for its jobs.",
    )
    availability_zone: str | None = Field(
        default=None,
        pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$",
        description="The one AZ of an EFA pool (required there, refused elsewhere): an instance "
        "type is not offered in every AZ, and deploy.preflight checks it is in this one.",
    )
    disk_size_gib: int = Field(default=200, ge=50, le=16000, description="gp3 root volume, GiB.")
    disk_throughput_mibps: int | None = Field(
        default=None,
        ge=125,
        le=1000,
        description="gp3 throughput of the root volume, MiB/s. Default: 600 where images "
        "unpack onto it, 125 where every type has NVMe instance store (images go to a RAID0 of "
        "it).",
    )
    expire_after: Duration | Literal["Never"] = Field(
        default="720h",
        description="A node's lifetime, 1h to 2160h or Never (Karpenter expireAfter): nodes "
        "are replaced to pick up patched AMIs. Expiration ignores disruption budgets, but with "
        "no terminationGracePeriod on the pools a node's running jobs and DevServers finish "
        "before it goes; changing it drifts the pool's nodes.",
    )
    fabric_check: FabricCheckConfig = Field(
        default=FabricCheckConfig(),
        description="The pool's NCCL fabric check (GPU pools only): python -m "
        "workloads.nccl_check.",
    )

    @model_validator(mode="after")
    def _fabric_check_fits(self) -> "NodePoolConfig":
        check = self.fabric_check
        if "fabric_check" in self.model_fields_set and not self.gpu:
            raise ValueError(
                "fabricCheck is set on a CPU pool; allowed: only on GPU pools (it runs NCCL)"
            )
        # The default (2) only matters when the check runs; the CLI refuses a pool too small.
        if "nodes" in check.model_fields_set and check.nodes > self.max_nodes:
            raise ValueError(
                f"fabricCheck.nodes {check.nodes} exceeds maxNodes {self.max_nodes}; allowed: "
                f"2 to {self.max_nodes}"
            )
        sizes = fabric_sizes(self.fabric_check_plan().max_bytes)
        for i, floor in enumerate(check.floors or []):
            if not any(floor.covers(size) for size in sizes):
                raise ValueError(
                    f"fabricCheck.floors[{i}] covers no size the check runs (8 B doubling up to "
                    f"{sizes[-1]} B); allowed: a range holding one of them, or a larger maxBytes"
                )
        return self

    @model_validator(mode="after")
    def _consistent(self) -> "NodePoolConfig":
        low, high = EXPIRE_AFTER_HOURS
        if self.expire_after != "Never" and not low <= hours(self.expire_after) <= high:
            raise ValueError(
                f"expireAfter {self.expire_after} is {hours(self.expire_after):g} hours; allowed: "
                f"{low}h to {high}h, or Never (nodes must be replaced to pick up patched AMIs)"
            )
        if len(set(self.capacity_types)) != len(self.capacity_types):
            raise ValueError(
                "capacityTypes repeats a value; allowed: on-demand, spot and/or reserved, once each"
            )
        self._reservations_fit()
        if len({t.gpus > 0 for t in self.types}) > 1:
            raise ValueError("instanceTypes mixes GPU and CPU types; allowed: all GPU or all CPU")
        without_efa = [t.name for t in self.types if not t.efa]
        if self.availability_zone and not self.efa:
            raise ValueError("availabilityZone is set but efa is false; allowed: only on EFA pools")
        if self.efa and without_efa:
            raise ValueError(
                f"efa is true but {', '.join(without_efa)} has no EFA; allowed with efa: "
                + ", ".join(t for t in load_catalog().names(gpu=True) if load_catalog()[t].efa)
            )
        return self

    def _reservations_fit(self) -> None:
        reserved = self.reserved_count
        if ("reserved" in self.capacity_types) != bool(self.capacity_reservations):
            raise ValueError(
                (
                    "capacityTypes lists reserved without capacityReservations (Karpenter would "
                    "find no reserved capacity)"
                    if reserved == 0
                    else "capacityReservations is set but capacityTypes lacks reserved "
                    "(Karpenter would never launch into them)"
                )
                + "; allowed: capacityReservations together with reserved in capacityTypes"
            )
        for i, reservation in enumerate(self.capacity_reservations):
            if reservation.instance_type not in self.instance_types:
                raise ValueError(
                    f"capacityReservations[{i}].instanceType {reservation.instance_type} is not "
                    f"one of the pool's instanceTypes; allowed: {', '.join(self.instance_types)}"
                )
        ids = [r.id for r in self.capacity_reservations if r.id]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(
                f"capacityReservations lists {', '.join(repeated)} more than once; allowed: "
                "each reservation once"
            )
        if reserved > self.max_nodes:
            raise ValueError(
                f"capacityReservations hold {reserved} instances but maxNodes is "
                f"{self.max_nodes}: Karpenter's limits would leave reservations you pay for "
                f"unused; allowed: maxNodes of at least {reserved}"
            )
        if self.capacity_types == ["reserved"] and reserved != self.max_nodes:
            raise ValueError(
                f"capacityTypes is only reserved, whose {reserved} instances are all Karpenter "
                f"can launch, but maxNodes is {self.max_nodes}: Kueue would admit jobs no node "
                f"can run; allowed: maxNodes {reserved}, or on-demand/spot beside reserved"
            )

    @property
    def reserved_count(self) -> int:
        """Instances the pool's reservations hold: billed whether or not the pool uses them."""
        return sum(r.instance_count for r in self.capacity_reservations)

    @property
    def topology(self) -> bool:
        """Kueue places this pool's jobs by network topology: its nodes exist (static) and carry
        EC2's topology labels. Kueue computes free capacity from existing nodes only, and
        Karpenter creates nodes only for pending pods: on a dynamic pool nothing would start."""
        return self.static_nodes and all(t.network_topology for t in self.types)

    @property
    def types(self) -> list[InstanceType]:
        return [load_catalog()[name] for name in self.instance_types]

    @property
    def instance_store(self) -> bool:
        """Every type has NVMe instance store: containerd's data (and image pulls) go to a RAID0
        of it, the root volume keeps the OS. A pool mixing in a type without keeps EBS for all."""
        return all(t.nvme for t in self.types)

    def root_throughput_mibps(self) -> int:
        """The root volume's gp3 throughput: configured, else by whether pulls write to it."""
        return self.disk_throughput_mibps or ROOT_THROUGHPUT_MIBPS[self.instance_store]

    @property
    def gpu(self) -> bool:
        return self.types[0].gpus > 0

    @property
    def gpus_per_node(self) -> int:
        """GPUs on the smallest node of the pool: what one pod per node can safely request."""
        return min(t.gpus for t in self.types)

    @property
    def procs_per_node(self) -> int:
        return processes_per_node(self)

    @property
    def efa_network_cards(self) -> int:
        """EFA interfaces every instance type of the pool can take (one per network card)."""
        return min(t.efa_network_cards for t in self.types) if self.efa else 0

    def job_pod_requests(self) -> tuple[int, int]:
        """(vCPU, GiB of memory) one job pod requests on this pool.

        A GPU pod has its node to itself (it asks for every GPU), so it asks for the room the
        pool's smallest node leaves (pod_room). A CPU pod asks for a fixed slice, several to a
        node.
        """
        if not self.gpu:
            return 2, 8
        return smallest_room(self.types)

    def fabric_check_plan(self, nodes: int | None = None) -> FabricCheckPlan:
        """The fabric check on `nodes` nodes (default: fabricCheck.nodes), with its floors."""
        check = self.fabric_check
        nodes = nodes or check.nodes
        floors: tuple[BusbwFloor, ...] = ()
        if check.floors is not None:
            floors = tuple(check.floors)
            basis = "floors from stack config" if floors else "no floor (stack config: floors [])"
        else:
            floors, basis = self._published_floors(nodes)
        largest = max((f.to_bytes or f.from_bytes for f in floors), default=0)
        max_bytes = check.max_bytes or max(largest, FABRIC_DEFAULT_MAX_BYTES)
        return FabricCheckPlan(nodes, max_bytes, floors, basis)

    def _published_floors(self, nodes: int) -> tuple[tuple[BusbwFloor, ...], str]:
        """The default floor: PUBLISHED_FLOOR_SHARE of the lowest published figure among the
        pool's families, when every family has one measured on this many nodes."""
        published = load_published_busbw()
        families = sorted({t.family for t in self.types})
        missing = [f for f in families if f not in published]
        if missing:
            return (), f"no floor: no published all_reduce_perf figure for {', '.join(missing)}"
        lowest = min((published[f] for f in families), key=lambda p: p.busbw)
        if lowest.nodes != nodes:
            return (), (
                f"no floor: the published {lowest.family} figure was measured on {lowest.nodes} "
                f"nodes, this check runs {nodes}"
            )
        floor = BusbwFloor.model_validate(
            {"fromBytes": lowest.bytes, "minBusbw": round(lowest.busbw * PUBLISHED_FLOOR_SHARE, 2)}
        )
        return (floor,), (
            f"default floor: {PUBLISHED_FLOOR_SHARE:.0%} of the published {lowest.family} figure "
            f"{lowest.busbw} GB/s at {lowest.bytes} B on {lowest.nodes} nodes ({lowest.source}); "
            "replace it with this cluster's measured figure"
        )

    def ceiling(self) -> PoolCeiling:
        """maxNodes times the largest figure among the pool's types, per resource."""
        return PoolCeiling(
            nodes=self.max_nodes,
            gpus=self.max_nodes * max(t.gpus for t in self.types),
            vcpu=self.max_nodes * max(t.vcpu for t in self.types),
            memory_gib=self.max_nodes * max(t.memory_gib for t in self.types),
        )


# What a node keeps back for the kubelet, the OS and the DaemonSets (VPC CNI, kube-proxy, Pod
# Identity agent, CSI node drivers): a job pod needs this much room besides its own requests.
NODE_RESERVE = {"vcpu": 0.5, "memory_gib": 1.5}


def job_pod_fits(pool: NodePoolConfig, instance: InstanceType) -> bool:
    cpu, memory_gib = pool.job_pod_requests()
    return (
        instance.vcpu - NODE_RESERVE["vcpu"] >= cpu
        and instance.memory_gib - NODE_RESERVE["memory_gib"] >= memory_gib
    )
