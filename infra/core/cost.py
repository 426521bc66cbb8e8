"""What a stack costs at list prices in its region, priced from the resources it declares.

One pricing path: the plan's cost table and the policy pack's budget rule both call stack_cost
on the declared resources (the plan's records offline, the engine's inputs in a real preview), so
an edit to the program or to stack config moves both alike.

Every resource type is one of three things (`classify`): priced by a pricer here, free (FREE, with
the reason), or usage-priced (USAGE_PRICED: billed per GB or request, estimated from the stack's
own jobs in infra/jobs/usage.py). A type that is none of them is listed as unpriced, never
counted as $0. Each priced line is one part of the bill:
  floor     billed from `pulumi up` on, whether or not a job runs: what runs, at its size (the
            system node group at desiredSize, static NodePools, reservations, the control plane)
  headroom  what a node group may add above its desiredSize, up to maxSize (ceiling only)
  pool      a dynamic NodePool at limits.nodes of its dearest type (ceiling only)
  quota     claims of a storage class, and DevServer SSH load balancers, up to a ResourceQuota:
            billed only as they exist (a plan cannot know which a cluster will hold)
The floor plus everything else is the ceiling; infra/jobs/expected.py prices what lies between.
"""

import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from infra.core.capacity import (
    SYSTEM_LABELS,
    PodSet,
    Requests,
    allocatable,
    system_fit,
    tolerates,
)
from infra.core.catalog import (
    HOURS_PER_MONTH,
    RegionPrices,
    ServicePrice,
    UnpricedError,
    load_prices,
)
from infra.core.declared import Declared, declared_in, dig, listed, quantity
from infra.core.offline import Plan
from infra.core.resource_types import (
    CLAIM,
    EKS_CLUSTER,
    EKS_COMPONENT,
    ELASTIC_IP,
    INSTANCE,
    KMS_KEY,
    LAUNCH_TEMPLATE,
    LUSTRE,
    NAT_GATEWAY,
    NODE_GROUP,
    NODECLASS,
    NODEPOOL,
    RESOURCE_FLAVOR,
    RESOURCE_QUOTA,
    SERVICE,
    SSM_PARAMETER,
    STORAGE_CLASS,
    SUBNET,
    VPC_ENDPOINT,
)
from infra.core.system_nodes import SYSTEM_NODE_LABEL
from infra.eks.support import support_on
from infra.vpc.network import PUBLIC_ELB_TAG

EBS_CSI = "ebs.csi.aws.com"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
# gp3's included performance (EBS pricing): IOPS and MiB/s above these bill per month.
GP3_FREE_IOPS, GP3_FREE_MIBPS = 3000, 125
# A ResourceQuota's cap on the claims of one StorageClass: `<class>` + this (kubernetes
# pkg/quota/v1/evaluator/core/persistent_volume_claims.go, V1ResourceByStorageClass). The
# DevServers component writes such a quota with devservers/api.py's own copy of this Kubernetes
# key: that module ships in the operator image, which carries no infra.
STORAGE_QUOTA_SUFFIX = ".storageclass.storage.k8s.io/requests.storage"
# What an EC2NodeClass's capacity reservations hold (JSON: a list of {instanceType,
# instanceCount, reservationType, durationHours?, upfrontFeeUsd?, id or tags}), written by
# infra/karpenter/node_pools.py.
RESERVATIONS_ANNOTATION = "training-platform/capacity-reservations"
# The machines a hybrid nodes' ResourceFlavor stands for (JSON: a list of {name, vcpu}), written
# by infra/hybrid/nodes.py: EKS bills hybrid nodes per vCPU-hour while they are joined.
HYBRID_MACHINES_ANNOTATION = "training-platform/hybrid-machines"
HYBRID_NODES_ITEM = "EKS hybrid nodes"
# On a DevServer user's ResourceQuota: how many SSH load balancers the user's servers may create
# (one per server, its pod 0's Service of type LoadBalancer), written by devservers/component.py
# when the platform allows LoadBalancer SSH (devServers.sshLoadBalancerCidrs).
SSH_LOAD_BALANCERS_ANNOTATION = "training-platform/ssh-load-balancers"


class Part(Enum):
    FLOOR = "floor"
    HEADROOM = "headroom"
    POOL = "pool"
    QUOTA = "quota"


@dataclass(frozen=True)
class CostLine:
    item: str  # a NodePool's name; else what the resource is and its name
    detail: str
    usd_per_hour: float  # math.inf: no ceiling (a NodePool without limits.nodes)
    part: Part = Part.FLOOR
    # A prepaid line (a Capacity Block) bills only for its length: its month is at most this.
    hours: float | None = None

    @property
    def usd_per_month(self) -> float:
        return self.usd_per_hour * min(self.hours or HOURS_PER_MONTH, HOURS_PER_MONTH)


class PriceBook:
    """A region's prices as one stack's pricing reads them, remembering which service prices it
    read: the plan names each one's source and flags the unverified."""

    def __init__(self, prices: RegionPrices):
        self.prices = prices
        self.read: dict[str, ServicePrice] = {}

    def usd(self, key: str) -> float:
        price = self.prices.service(key)
        self.read[key] = price
        return price.usd

    def instance(self, name: str) -> float:
        return self.prices.instance(name)

    def per_hour(self, key: str) -> float:
        """A monthly service price per hour."""
        return self.usd(key) / HOURS_PER_MONTH


@dataclass(frozen=True)
class StackCost:
    prices: RegionPrices
    lines: list[CostLine]
    unpriced: list[str]  # resources their pricer could not price, and why
    unpriced_types: list[str]  # types with no pricer that are neither free nor usage-priced
    usage_types: list[str]  # usage-priced types present: infra/jobs/usage.py estimates them
    book: PriceBook  # what was read of the prices, by these lines and what builds on them

    @property
    def read(self) -> dict[str, ServicePrice]:
        """The service prices read so far: the plan names each one's source."""
        return self.book.read

    def part(self, part: Part) -> list[CostLine]:
        return [line for line in self.lines if line.part == part]

    @property
    def baseline(self) -> list[CostLine]:
        """The floor: billed from `pulumi up` on, whether or not a job runs."""
        return self.part(Part.FLOOR)

    @property
    def headroom(self) -> list[CostLine]:
        return self.part(Part.HEADROOM)

    @property
    def pools(self) -> list[CostLine]:
        return self.part(Part.POOL)

    @property
    def quotas(self) -> list[CostLine]:
        return self.part(Part.QUOTA)

    @property
    def baseline_per_hour(self) -> float:
        return sum(line.usd_per_hour for line in self.baseline)

    @property
    def baseline_per_month(self) -> float:
        return sum(line.usd_per_month for line in self.baseline)

    @property
    def headroom_per_hour(self) -> float:
        return sum(line.usd_per_hour for line in self.headroom)

    @property
    def pools_per_hour(self) -> float:
        return sum(line.usd_per_hour for line in self.pools)

    @property
    def quotas_per_hour(self) -> float:
        return sum(line.usd_per_hour for line in self.quotas)

    @property
    def total_per_hour(self) -> float:
        """The ceiling: the most this stack can cost in an hour."""
        return sum(line.usd_per_hour for line in self.lines)


def money(usd: float, digits: int = 2) -> str:
    return "unbounded" if math.isinf(usd) else f"{usd:,.{digits}f}"


def _size(value: object) -> float:
    """A Kubernetes quantity the price depends on; one this cannot read leaves the line unpriced."""
    try:
        return quantity(value)
    except ValueError as e:
        raise UnpricedError(str(e)) from None


def _required(props: object, *path: str) -> object:
    """A field the price depends on: missing (a program edit dropped it), the line is unpriced."""
    value = dig(props, *path)
    if value is None:
        raise UnpricedError(f"no {'.'.join(path)} to price it by")
    return value


@dataclass(frozen=True)
class Gp3:
    """One gp3 volume: its size and the performance it asks for above gp3's included."""

    gib: float
    iops: int = GP3_FREE_IOPS
    mibps: int = GP3_FREE_MIBPS

    def per_hour(self, book: PriceBook) -> float:
        extra_iops = max(self.iops - GP3_FREE_IOPS, 0)
        extra_mibps = max(self.mibps - GP3_FREE_MIBPS, 0)
        usd = self.gib * book.per_hour("ebsGp3PerGibMonth")
        if extra_iops:
            usd += extra_iops * book.per_hour("ebsGp3PerIopsMonth")
        if extra_mibps:
            usd += extra_mibps * book.per_hour("ebsGp3PerMibpsMonth")
        return usd

    def describe(self) -> str:
        extras = [f"{self.iops} IOPS"] if self.iops > GP3_FREE_IOPS else []
        extras += [f"{self.mibps} MiB/s"] if self.mibps > GP3_FREE_MIBPS else []
        return f"{self.gib:g} GiB gp3" + (f" at {', '.join(extras)}" if extras else "")


def _require_gp3(volume_type: object, book: PriceBook) -> None:
    """EBS gp3 is the one volume type the price files price."""
    if volume_type != "gp3":
        raise UnpricedError(
            f"EBS {volume_type or 'volume without a volumeType'} has no price in "
            f"{book.prices.file} (servicePrices price gp3)"
        )


def _gp3(volume: object, book: PriceBook, kubernetes: bool = False) -> Gp3:
    """A launch template's or node class's EBS mapping (volumeSize in GiB, or a quantity)."""
    _require_gp3(dig(volume, "volumeType"), book)
    size = dig(volume, "volumeSize") or 0
    gib = _size(size) / 1024**3 if kubernetes else float(size)
    return Gp3(
        gib,
        int(dig(volume, "iops") or GP3_FREE_IOPS),
        int(dig(volume, "throughput") or GP3_FREE_MIBPS),
    )


def _disks(mappings: list, book: PriceBook, kubernetes: bool = False) -> list[Gp3]:
    return [_gp3(dig(m, "ebs"), book, kubernetes) for m in mappings]


def _describe_disks(disks: list[Gp3]) -> str:
    return " + ".join(d.describe() for d in disks) or "no EBS"


def _control_plane(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    # pulumi-eks's Cluster creates an aws:eks/cluster:Cluster, which a real preview shows too.
    if r.type == EKS_COMPONENT and any(other.type == EKS_CLUSTER for other in stack):
        return []
    # EKS's API default upgrade policy is EXTENDED (infra/eks/support.py).
    policy = str(dig(r.props, "upgradePolicy", "supportType") or "EXTENDED")
    support = support_on(str(_required(r.props, "version")), policy)
    rate = (
        "eksExtendedSupportPerHour" if support.tier == "extended" else "eksStandardSupportPerHour"
    )
    return [CostLine(f"EKS control plane {r.name}", support.detail, book.usd(rate))]


def _nat_gateway(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    return [
        CostLine(
            f"NAT gateway {r.name}",
            f"+ ${book.usd('natGatewayPerGb')}/GB processed (usage)",
            book.usd("natGatewayPerHour"),
        )
    ]


def _vpc_endpoint(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """An interface endpoint bills per hour in each AZ it has a network interface in (one per
    subnet); a gateway endpoint (S3), EC2's default type, has no charge."""
    kind = dig(r.props, "vpcEndpointType") or "Gateway"
    service = str(dig(r.props, "serviceName")).rsplit(".", 1)[-1]
    if kind == "Gateway":
        return [CostLine(f"VPC endpoint {r.name}", f"{service} gateway, free", 0.0)]
    if kind != "Interface":
        raise UnpricedError(f"a {kind} VPC endpoint has no price in {book.prices.file}")
    azs = len(listed(dig(r.props, "subnetIds")))
    return [
        CostLine(
            f"VPC endpoint {r.name}",
            f"{service} interface in {azs} AZs, + ${book.usd('vpcInterfaceEndpointPerGb')}/GB",
            azs * book.usd("vpcInterfaceEndpointPerAzHour"),
        )
    ]


def _node_group(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """desiredSize nodes of the dearest type, each with its launch template's disks, in the
    floor: nothing scales a managed node group without a cluster autoscaler, and Karpenter does
    not manage it. maxSize is what it may grow to by hand: the rest is ceiling headroom."""
    desired = int(_required(r.props, "scalingConfig", "desiredSize"))
    most = int(_required(r.props, "scalingConfig", "maxSize"))
    types = [str(t) for t in listed(dig(r.props, "instanceTypes"))]
    if not types:
        raise UnpricedError("no instanceTypes to price it by")
    templates = [d for d in stack if d.urn in r.dependencies and d.type == LAUNCH_TEMPLATE]
    disks = _disks(
        [m for t in templates for m in listed(dig(t.props, "blockDeviceMappings"))], book
    )
    dearest = max(types, key=book.instance)
    per_node = book.instance(dearest) + sum(d.per_hour(book) for d in disks)
    each = f"{dearest}, {_describe_disks(disks)} each"
    lines = [
        CostLine(f"node group {r.name}", f"{desired} x {each} (desiredSize)", desired * per_node)
    ]
    if most > desired:
        lines.append(
            CostLine(
                f"node group {r.name} to maxSize",
                f"up to {most - desired} more x {dearest} (maxSize {most})",
                (most - desired) * per_node,
                Part.HEADROOM,
            )
        )
    return lines


def _lustre(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    kind = dig(r.props, "deploymentType")
    if kind != "PERSISTENT_2":
        raise UnpricedError(
            f"FSx for Lustre {kind} has no price in {book.prices.file} (servicePrices price "
            "PERSISTENT_2 SSD)"
        )
    gib = int(_required(r.props, "storageCapacity"))
    throughput = int(_required(r.props, "perUnitStorageThroughput"))
    rate = book.usd(book.prices.fsx_key(throughput))
    return [
        CostLine(
            f"FSx for Lustre {r.name}",
            f"{gib} GiB at {throughput} MB/s/TiB",
            gib * rate / HOURS_PER_MONTH,
        )
    ]


def _instance(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    kind = str(_required(r.props, "instanceType"))
    root = dig(r.props, "rootBlockDevice")
    # Without a volumeSize the root volume takes the AMI's size (a few GiB): not priced.
    disk = _gp3(root, book) if dig(root, "volumeSize") else None
    return [
        CostLine(
            f"EC2 instance {r.name}",
            f"{kind}, {disk.describe()}" if disk else kind,
            book.instance(kind) + (disk.per_hour(book) if disk else 0.0),
        )
    ]


def _elastic_ip(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """A public IPv4 address bills per hour, attached or idle (since 2024-02-01). EC2 releases
    the hybrid gateway's launch-time public address when its Elastic IP attaches (EC2 User Guide,
    "Public IPv4 addresses"), so this line is the gateway's only address."""
    return [CostLine(f"Elastic IP {r.name}", "public IPv4 address", book.usd("publicIpv4PerHour"))]


def _kms_key(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """$1/month a key; with automatic rotation each yearly backing key adds $1/month (KMS
    pricing: the first two rotations are billed, later ones not), so a rotated key reaches $3."""
    detail = "customer managed key"
    if dig(r.props, "enableKeyRotation"):
        detail += ", +$1/month per yearly rotation (the first two)"
    return [CostLine(f"KMS key {r.name}", detail, book.per_hour("kmsKeyPerMonth"))]


def _ssm_parameter(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """Standard-tier parameters are free; an advanced one bills per month."""
    if (dig(r.props, "tier") or "Standard") == "Standard":
        return []
    return [
        CostLine(
            f"SSM parameter {r.name}",
            "advanced tier",
            book.per_hour("ssmAdvancedParameterPerMonth"),
        )
    ]


def _listed_annotation(r: Declared, annotation: str) -> list:
    """A JSON list this program writes into a resource's annotation; [] where there is none."""
    raw = dig(r.props, "metadata", "annotations", annotation)
    if raw is None:
        return []
    try:
        return listed(json.loads(str(raw)))
    except json.JSONDecodeError:
        raise UnpricedError(f"its {annotation} annotation is not JSON") from None


def reservations(node_class: Declared) -> list:
    return _listed_annotation(node_class, RESERVATIONS_ANNOTATION)


def _hybrid_nodes(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """EKS bills a joined hybrid node per vCPU-hour, in tiers by the account's monthly vCPU-hours;
    the first (dearest) tier's rate bounds it. The machines themselves are their owners' cost."""
    machines = _listed_annotation(r, HYBRID_MACHINES_ANNOTATION)
    if not machines:
        return []
    vcpu = sum(int(_required(m, "vcpu")) for m in machines)
    rate = book.usd("eksHybridNodesPerVcpuHour")
    return [
        CostLine(
            HYBRID_NODES_ITEM,
            f"{len(machines)} machines, {vcpu} vCPU at ${rate}/vCPU-hour (first tier)",
            vcpu * rate,
        )
    ]


def _capacity_block(entry: object, kind: str, count: int, book: PriceBook) -> tuple[float, str]:
    """A block's hourly rate while held, and how it was priced: its own fee, else the region's
    published block rate. Paid up front for its whole length, used or not."""
    hours = int(_required(entry, "durationHours"))
    fee = dig(entry, "upfrontFeeUsd")
    if fee is not None:
        rate = float(fee) / (count * hours)
        source = "its upfrontFeeUsd"
    else:
        published = book.prices.capacity_block_usd_per_hour.get(kind)
        if published is None:
            raise UnpricedError(
                f"a Capacity Block of {kind} has no published rate in {book.prices.file} "
                "(capacityBlockPrices): set the block's upfrontFeeUsd"
            )
        book.read[published.key] = published
        rate, source = published.usd, f"published rate ${published.usd}/instance-hour"
    paid = count * hours * rate
    return rate, f"{count} x {kind} Capacity Block, {hours} h paid up front ${paid:,.0f} ({source})"


def _reserved_capacity(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """A reservation bills for the instances it holds, used or not: an On-Demand Capacity
    Reservation every hour at the type's On-Demand rate; a Capacity Block up front for its length
    at its own rate (one line per block: its month is at most its length)."""
    name = dig(r.props, "metadata", "name") or r.name
    odcr_parts, odcr_per_hour, lines = [], 0.0, []
    for entry in reservations(r):
        kind, count = str(_required(entry, "instanceType")), int(_required(entry, "instanceCount"))
        if dig(entry, "reservationType") == "capacity-block":
            rate, detail = _capacity_block(entry, kind, count, book)
            hours = float(_required(entry, "durationHours"))
            item = f"capacity block {name} {len(lines) + 1}"
            lines.append(CostLine(item, detail, count * rate, hours=hours))
        else:
            odcr_per_hour += count * book.instance(kind)
            odcr_parts.append(f"{count} x {kind} ODCR")
    if odcr_parts:
        detail = f"{', '.join(odcr_parts)}, billed used or not"
        lines.insert(0, CostLine(f"reserved {name}", detail, odcr_per_hour))
    return lines


def pool_types(spec: object) -> list[str]:
    """The instance types a NodePool template's requirements allow (its In requirement)."""
    return [
        str(t)
        for requirement in listed(dig(spec, "requirements"))
        if dig(requirement, "key") == INSTANCE_TYPE_LABEL and dig(requirement, "operator") == "In"
        for t in listed(dig(requirement, "values"))
    ]


def pool_capacity_types(spec: object) -> list[str]:
    return [
        str(t)
        for requirement in listed(dig(spec, "requirements"))
        if dig(requirement, "key") == CAPACITY_TYPE_LABEL
        for t in listed(dig(requirement, "values"))
    ]


def node_class_of(pool: Declared, stack: Sequence[Declared]) -> list[Declared]:
    name = dig(pool.props, "spec", "template", "spec", "nodeClassRef", "name")
    return [d for d in stack if d.type == NODECLASS and dig(d.props, "metadata", "name") == name]


def node_disks(classes: list[Declared], book: PriceBook) -> list[Gp3]:
    mappings = [m for c in classes for m in listed(dig(c.props, "spec", "blockDeviceMappings"))]
    return _disks(mappings, book, kubernetes=True)


def reserved_count(classes: list[Declared]) -> int:
    return sum(int(_required(e, "instanceCount")) for c in classes for e in reservations(c))


def _node_pool(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """limits.nodes of the dearest type it may launch, each with its node class's disks; nodes
    its class's reservations hold are priced on the reservation's line instead."""
    name = str(dig(r.props, "metadata", "name") or r.name)
    spec = dig(r.props, "spec", "template", "spec")
    types = pool_types(spec)
    nodes = dig(r.props, "spec", "limits", "nodes")
    if nodes is None or not types:
        unbounded = "no limits.nodes" if nodes is None else "no instance-type In requirement"
        return [CostLine(name, unbounded, math.inf, Part.POOL)]
    classes = node_class_of(r, stack)
    disks = node_disks(classes, book)
    dearest = max(types, key=book.instance)
    count = _size(nodes)
    reserved = reserved_count(classes)
    detail = f"{count:g} x {dearest}, {_describe_disks(disks)} each"
    if reserved:
        detail += f", {reserved} of them reserved (their line)"
    # A static NodePool keeps its nodes running: always on, not a ceiling.
    static = dig(r.props, "spec", "replicas") is not None
    disk_per_hour = sum(d.per_hour(book) for d in disks)
    return [
        CostLine(
            name,
            f"static, always on: {detail}" if static else detail,
            max(count - reserved, 0) * book.instance(dearest) + count * disk_per_hour,
            Part.FLOOR if static else Part.POOL,
        )
    ]


def _storage_class(name: str, stack: Sequence[Declared], book: PriceBook) -> None:
    """The stack's StorageClass `name` must be an EBS gp3 class: the one kind priced."""
    found = [
        d for d in stack if d.type == STORAGE_CLASS and dig(d.props, "metadata", "name") == name
    ]
    if not found or dig(found[0].props, "provisioner") != EBS_CSI:
        raise UnpricedError(f"storage class {name} is not an EBS class of this stack")
    _require_gp3(dig(found[0].props, "parameters", "type"), book)


def _public_azs(stack: Sequence[Declared]) -> int:
    """How many AZs a public load balancer spans: the subnets tagged for one."""
    key, value = next(iter(PUBLIC_ELB_TAG.items()))
    return sum(1 for d in stack if d.type == SUBNET and dig(d.props, "tags", key) == value)


def _resource_quota(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """What a namespace's quota lets exist: gp3 claims up to `<class>` + STORAGE_QUOTA_SUFFIX, and
    DevServer SSH load balancers (SSH_LOAD_BALANCERS_ANNOTATION). Without an annotation the
    in-tree service controller makes a Service of type LoadBalancer a Classic Load Balancer
    across the public subnets, each AZ with its own public IPv4 address."""
    hard = dig(r.props, "spec", "hard") or {}
    meta = dig(r.props, "metadata")
    where = f"{dig(meta, 'namespace')}/{dig(meta, 'name')}"
    lines = []
    storage = {
        key.removesuffix(STORAGE_QUOTA_SUFFIX): amount
        for key, amount in hard.items()
        if key.endswith(STORAGE_QUOTA_SUFFIX)
    }
    if storage:
        for class_name in storage:
            _storage_class(class_name, stack, book)
        gib = sum(_size(amount) / 1024**3 for amount in storage.values())
        lines.append(
            CostLine(
                f"storage quota {where}",
                f"up to {gib:g} GiB of {', '.join(storage)} claims, in use or kept",
                Gp3(gib).per_hour(book),
                Part.QUOTA,
            )
        )
    balancers = dig(meta, "annotations", SSH_LOAD_BALANCERS_ANNOTATION)
    if balancers:
        count, azs = int(balancers), _public_azs(stack)
        each = book.usd("classicLoadBalancerPerHour") + azs * book.usd("publicIpv4PerHour")
        lines.append(
            CostLine(
                f"SSH load balancers {where}",
                f"up to {count} Classic LBs (one a server) in {azs} AZs, "
                f"+ ${book.usd('classicLoadBalancerPerGb')}/GB",
                count * each,
                Part.QUOTA,
            )
        )
    return lines


def _service(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """A Service of type LoadBalancer is a Classic Load Balancer (the in-tree controller's
    default without annotations) with a public IPv4 address in each public subnet's AZ."""
    if dig(r.props, "spec", "type") != "LoadBalancer":
        return []
    azs = _public_azs(stack)
    return [
        CostLine(
            f"load balancer {dig(r.props, 'metadata', 'name') or r.name}",
            f"Classic LB in {azs} AZs, + ${book.usd('classicLoadBalancerPerGb')}/GB",
            book.usd("classicLoadBalancerPerHour") + azs * book.usd("publicIpv4PerHour"),
        )
    ]


def _claim(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """A claim the program declares: a gp3 class provisions an EBS volume of its size; a claim
    bound to a declared volume or of an EFS class adds nothing (that store is priced itself)."""
    spec = dig(r.props, "spec")
    class_name = dig(spec, "storageClassName")
    if dig(spec, "volumeName") or class_name == "":
        return []
    provisioner = next(
        (
            dig(d.props, "provisioner")
            for d in stack
            if d.type == STORAGE_CLASS and dig(d.props, "metadata", "name") == class_name
        ),
        None,
    )
    if provisioner != EBS_CSI:
        if provisioner is None:
            raise UnpricedError(f"its storage class {class_name} is not one of this stack")
        return []
    _storage_class(class_name, stack, book)
    gib = _size(_required(spec, "resources", "requests", "storage")) / 1024**3
    return [CostLine(f"volume {r.name}", f"{gib:g} GiB gp3", Gp3(gib).per_hour(book))]


def _accepts(pool: Declared, pods: PodSet) -> bool:
    """Would Karpenter launch a node of this dynamic pool for these pods: they tolerate its
    taints and ask only for labels its nodes carry."""
    template = dig(pool.props, "spec", "template")
    labels = {**SYSTEM_LABELS, **(dig(template, "metadata", "labels") or {})}
    labels.pop(next(iter(SYSTEM_NODE_LABEL)))
    taints = listed(dig(template, "spec", "taints"))
    return all(labels.get(k) == v for k, v in pods.node_selector.items()) and all(
        tolerates(pods.tolerations, taint) for taint in taints
    )


def stray_pool_lines(stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """Add-on pods the system nodes refuse (infra/core/capacity.py) land on a dynamic pool that
    accepts them, on its cheapest type, and keep those nodes running: floor, not ceiling."""
    fit = system_fit(stack)
    if fit is None or not fit.stray:
        return []
    pools = [r for r in stack if r.type == NODEPOOL and dig(r.props, "spec", "replicas") is None]
    names = ", ".join(p.name for p in fit.stray)
    accepting = [p for p in pools if all(_accepts(p, pods) for pods in fit.stray)]
    if not accepting:
        raise UnpricedError(f"{names}: neither the system nodes nor any pool take them (Pending)")

    def cheapest(pool: Declared) -> tuple[float, str]:
        return min(
            (book.instance(t), t) for t in pool_types(dig(pool.props, "spec", "template", "spec"))
        )

    pool = min(accepting, key=cheapest)
    price, kind = cheapest(pool)
    asked = Requests()
    for pods in fit.stray:
        asked = asked + pods.each * pods.replicas
    room = allocatable(kind)
    nodes = max(1, math.ceil(asked.cpu / room.cpu), math.ceil(asked.memory_mib / room.memory_mib))
    disks = node_disks(node_class_of(pool, stack), book)
    name = dig(pool.props, "metadata", "name") or pool.name
    return [
        CostLine(
            f"{name} (add-ons)",
            f"{nodes} x {kind}, {_describe_disks(disks)}, kept up by {names}",
            nodes * (price + sum(d.per_hour(book) for d in disks)),
        )
    ]


Pricer = Callable[[Declared, Sequence[Declared], PriceBook], list[CostLine]]
PRICERS: dict[str, Pricer] = {
    EKS_COMPONENT: _control_plane,
    EKS_CLUSTER: _control_plane,
    NAT_GATEWAY: _nat_gateway,
    VPC_ENDPOINT: _vpc_endpoint,
    NODE_GROUP: _node_group,
    LUSTRE: _lustre,
    INSTANCE: _instance,
    ELASTIC_IP: _elastic_ip,
    KMS_KEY: _kms_key,
    SSM_PARAMETER: _ssm_parameter,
    RESOURCE_FLAVOR: _hybrid_nodes,
    NODEPOOL: _node_pool,
    NODECLASS: _reserved_capacity,
    RESOURCE_QUOTA: _resource_quota,
    SERVICE: _service,
    CLAIM: _claim,
}
# Billed per GB, request or GB-month of what a cluster does: infra/jobs/usage.py estimates them
# from the stack's jobs where it can, else names the unit price.
USAGE_PRICED = {
    "aws:s3/bucket:Bucket": "S3 storage per GB-month and requests",
    "aws:efs/fileSystem:FileSystem": "EFS storage per GB-month, Elastic Throughput per GB",
    "aws:ecr/repository:Repository": "ECR storage per GB-month of image layers",
    "aws:cloudwatch/logGroup:LogGroup": "CloudWatch Logs ingestion per GB, storage per GB-month",
    "aws:sqs/queue:Queue": "SQS per million requests after the first million a month",
    "aws:efs/backupPolicy:BackupPolicy": "AWS Backup storage of the EFS recovery points per "
    "GB-month (AWS Backup pricing)",
}
# Types that bill nothing themselves, each with why (what bills instead, where something does).
_VPC = "VPC pricing: no charge for the VPC and its routing and security constructs"
_IAM = "IAM has no charge"
_K8S = "a Kubernetes object in etcd: the control plane's hourly rate covers it"
_RUNS_ON_NODES = "software whose pods run on nodes the plan prices (system nodes, pools)"
FREE: dict[str, str] = {
    "aws:ec2/vpc:Vpc": _VPC,
    "aws:ec2/subnet:Subnet": _VPC,
    "aws:ec2/routeTable:RouteTable": _VPC,
    "aws:ec2/routeTableAssociation:RouteTableAssociation": _VPC,
    "aws:ec2/route:Route": _VPC,
    "aws:ec2/internetGateway:InternetGateway": _VPC,
    "aws:ec2/securityGroup:SecurityGroup": _VPC,
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": _VPC,
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": _VPC,
    "aws:ec2/tag:Tag": "a tag on another resource",
    "aws:ec2/launchTemplate:LaunchTemplate": "a template: its instances and disks are priced "
    "on the node group's line",
    "aws:ec2/placementGroup:PlacementGroup": "EC2: no charge for placement groups (from memory)",
    "aws:iam/role:Role": _IAM,
    "aws:iam/rolePolicy:RolePolicy": _IAM,
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": _IAM,
    "aws:iam/instanceProfile:InstanceProfile": _IAM,
    "aws:kms/alias:Alias": "KMS: aliases have no charge (the key is priced)",
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": "bucket configuration "
    "(the bucket's storage and requests are usage)",
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls": "bucket configuration",
    "aws:s3/bucketPolicy:BucketPolicy": "bucket configuration",
    "aws:s3/bucketObjectv2:BucketObjectv2": "an empty object (FSx's team marker): its PUT and "
    "storage are too small to price",
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": "bucket configuration",
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": (
        "bucket configuration (SSE-KMS requests bill on the key's request rate, usage)"
    ),
    "aws:s3/bucketVersioning:BucketVersioning": "bucket configuration (noncurrent versions "
    "bill as storage, usage)",
    "aws:sqs/queuePolicy:QueuePolicy": "queue configuration",
    "aws:cloudwatch/eventRule:EventRule": "EventBridge: events AWS services send to the default "
    "bus are free (these match EC2 and AWS Health events; EventBridge pricing, from memory)",
    "aws:cloudwatch/eventTarget:EventTarget": "EventBridge: part of its rule",
    "aws:ecr/lifecyclePolicy:LifecyclePolicy": "ECR: lifecycle policies are free (they bound "
    "the repository's storage)",
    "aws:ecr/repositoryPolicy:RepositoryPolicy": "ECR: a repository's permissions (storage "
    "and transfer bill, usage)",
    "aws:efs/mountTarget:MountTarget": "EFS bills storage and throughput, not mount targets",
    "aws:efs/accessPoint:AccessPoint": "EFS bills storage and throughput, not access points",
    "aws:efs/fileSystemPolicy:FileSystemPolicy": "EFS bills storage and throughput, not its "
    "file system policy",
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": "FSx: the link is free; its "
    "imports and exports are S3 requests (usage)",
    "aws:eks/addon:Addon": f"EKS add-ons have no charge: {_RUNS_ON_NODES}",
    "aws:eks/accessEntry:AccessEntry": "EKS: access entries have no charge",
    "aws:eks/accessPolicyAssociation:AccessPolicyAssociation": "EKS: part of an access entry",
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": "EKS: Pod Identity has no charge",
    "aws:ssm/activation:Activation": "Systems Manager: hybrid activations register standard-tier "
    "managed instances, free up to 1,000 per account and region (SSM pricing, from memory)",
    "docker-build:index:Image": "built where pulumi runs; its layers bill as ECR storage (usage)",
    "random:index/randomBytes:RandomBytes": "generated by Pulumi, no cloud resource",
    "kubernetes:helm.sh/v3:Release": f"a Helm release: {_RUNS_ON_NODES}",
    "kubernetes:kustomize/v2:Directory": f"manifests applied: {_RUNS_ON_NODES}",
    "kubernetes:apps/v1:Deployment": f"{_K8S}; {_RUNS_ON_NODES}",
    "kubernetes:batch/v1:CronJob": f"{_K8S}; {_RUNS_ON_NODES}",
    "kubernetes:kubeflow.org/v1:PyTorchJob": f"{_K8S}; its pods run on the pools (expected)",
    "kubernetes:kubeflow.org/v2beta1:MPIJob": f"{_K8S}; its pods run on the pools (expected)",
    "kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob": f"{_K8S}; its pods run on the pools "
    "(expected)",
    "kubernetes:trainer.kubeflow.org/v1alpha1:ClusterTrainingRuntime": f"{_K8S}; the pods of "
    "TrainJobs the teams submit run on its pool, within the pool's ceiling",
    "kubernetes:core/v1:PersistentVolume": f"{_K8S}; it names a volume priced itself (FSx)",
    **{
        f"kubernetes:{kind}": _K8S
        for kind in (
            "admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy",
            "admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding",
            "apiextensions.k8s.io/v1:CustomResourceDefinition",
            "core/v1:Namespace",
            "core/v1:ServiceAccount",
            "core/v1:ConfigMap",
            "core/v1:Secret",
            "dev.training-platform.io/v1alpha1:DevServerFlavor",
            "kueue.x-k8s.io/v1beta2:ClusterQueue",
            "kueue.x-k8s.io/v1beta2:LocalQueue",
            "kueue.x-k8s.io/v1beta2:Topology",
            "networking.k8s.io/v1:NetworkPolicy",
            "rbac.authorization.k8s.io/v1:ClusterRole",
            "rbac.authorization.k8s.io/v1:ClusterRoleBinding",
            "rbac.authorization.k8s.io/v1:Role",
            "rbac.authorization.k8s.io/v1:RoleBinding",
            "storage.k8s.io/v1:StorageClass",
        )
    },
}
# The program's own components group resources and create nothing themselves; `pulumi:` types are
# the engine's (the stack, providers).
COMPONENT_PREFIXES = ("training-platform:", "pulumi:")


def classify(kind: str) -> str:
    """`priced`, `usage`, `free` or `unpriced`: what the plan does with a resource type."""
    if kind in PRICERS:
        return "priced"
    if kind in USAGE_PRICED:
        return "usage"
    if kind in FREE or kind.startswith(COMPONENT_PREFIXES):
        return "free"
    return "unpriced"


def stack_cost(prices: RegionPrices, stack: Sequence[Declared]) -> StackCost:
    """Every priced resource of `stack` as a line of its part of the bill; what cannot be priced
    is named instead."""
    book = PriceBook(prices)
    lines, unpriced = [], []
    for kind, pricer in PRICERS.items():
        for resource in (r for r in stack if r.type == kind):
            try:
                lines += pricer(resource, stack, book)
            except UnpricedError as e:
                unpriced.append(f"{resource.name}: {e}")
    try:
        lines += stray_pool_lines(stack, book)
    except UnpricedError as e:
        unpriced.append(str(e))
    counts = Counter(r.type for r in stack)
    unpriced_types = [
        f"{kind} ({n}): no pricer, not known to be free"
        for kind, n in sorted(counts.items())
        if classify(kind) == "unpriced"
    ]
    usage_types = sorted(kind for kind in counts if classify(kind) == "usage")
    return StackCost(prices, lines, unpriced, unpriced_types, usage_types, book)


def plan_cost(region: str, plan: Plan) -> StackCost:
    return stack_cost(load_prices(region), declared_in(plan))
