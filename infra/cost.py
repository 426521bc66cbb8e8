"""What a stack can cost at list prices in its region, priced from the resources it declares.

One pricing path: the plan's cost table and the policy pack's budget rule both call stack_cost
on the declared resources (the plan's records offline, the engine's inputs in a real preview), so
an edit to the program or to stack config moves both alike. Each line is that resource's ceiling
per hour: a NodePool at limits.nodes of its dearest type, a node group at maxSize, storage at its
provisioned size, hybrid machines at their vCPUs, the claims of a storage class at their
ResourceQuota (DevServer homes, kept ones included: a plan cannot know which claims a cluster
will hold). Fixed-rate items only; usage-priced ones (S3 and EFS storage, data transfer, NAT and
VPC endpoint data processing, job volumes, internet egress between hybrid machines) are named
with their unit price, not guessed.
"""

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from infra.catalog import HOURS_PER_MONTH, RegionPrices, UnpricedError, load_prices
from infra.declared import Declared, declared_in, dig, listed
from infra.offline import Plan

EKS_COMPONENT = "eks:index:Cluster"
EKS_CLUSTER = "aws:eks/cluster:Cluster"
NAT_GATEWAY = "aws:ec2/natGateway:NatGateway"
VPC_ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
INSTANCE = "aws:ec2/instance:Instance"
ELASTIC_IP = "aws:ec2/eip:Eip"
RESOURCE_FLAVOR = "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor"
NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
NODECLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
RESOURCE_QUOTA = "kubernetes:core/v1:ResourceQuota"
STORAGE_CLASS = "kubernetes:storage.k8s.io/v1:StorageClass"
EBS_CSI = "ebs.csi.aws.com"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# A ResourceQuota's cap on the claims of one StorageClass: `<class>` + this (kubernetes
# pkg/quota/v1/evaluator/core/persistent_volume_claims.go, V1ResourceByStorageClass). The
# DevServers component writes such a quota with devservers/api.py's own copy of this Kubernetes
# key: that module ships in the operator image, which carries no infra.
STORAGE_QUOTA_SUFFIX = ".storageclass.storage.k8s.io/requests.storage"
# What an EC2NodeClass's capacity reservations hold (JSON: a list of {instanceType,
# instanceCount, reservationType, id or tags}), written by infra/components/node_pools.py.
RESERVATIONS_ANNOTATION = "training-platform/capacity-reservations"
# The machines a hybrid nodes' ResourceFlavor stands for (JSON: a list of {name, vcpu}), written
# by infra/components/hybrid_nodes.py: EKS bills hybrid nodes per vCPU-hour while they are joined.
HYBRID_MACHINES_ANNOTATION = "training-platform/hybrid-machines"
HYBRID_NODES_ITEM = "EKS hybrid nodes"
# Kubernetes quantity suffixes (resource.Quantity): binary and decimal.
QUANTITY_UNITS = {
    **{s: 1024**i for i, s in enumerate(("", "Ki", "Mi", "Gi", "Ti", "Pi"))},
    **{s: 1000**i for i, s in enumerate(("k", "M", "G", "T", "P"), start=1)},
}


@dataclass(frozen=True)
class CostLine:
    item: str  # a NodePool's name; else what the resource is and its name
    detail: str
    usd_per_hour: float  # math.inf: no ceiling (a NodePool without limits.nodes)
    node_pool: bool = False
    quota: bool = False  # billed only as claims exist, up to a ResourceQuota


@dataclass(frozen=True)
class StackCost:
    prices: RegionPrices
    lines: list[CostLine]
    unpriced: list[str]  # resources the region's price file cannot price, and why
    usage_priced: list[str]

    @property
    def baseline(self) -> list[CostLine]:
        """Billed from `pulumi up` on, whether or not a job runs."""
        return [line for line in self.lines if not (line.node_pool or line.quota)]

    @property
    def quotas(self) -> list[CostLine]:
        return [line for line in self.lines if line.quota]

    @property
    def pools(self) -> list[CostLine]:
        return [line for line in self.lines if line.node_pool]

    @property
    def baseline_per_hour(self) -> float:
        return sum(line.usd_per_hour for line in self.baseline)

    @property
    def pools_per_hour(self) -> float:
        return sum(line.usd_per_hour for line in self.pools)

    @property
    def quotas_per_hour(self) -> float:
        return sum(line.usd_per_hour for line in self.quotas)

    @property
    def total_per_hour(self) -> float:
        return self.baseline_per_hour + self.pools_per_hour + self.quotas_per_hour


def money(usd: float, digits: int = 2) -> str:
    return "unbounded" if math.isinf(usd) else f"{usd:,.{digits}f}"


def _required(props: object, *path: str) -> object:
    """A field the price depends on: missing (a program edit dropped it), the line is unpriced."""
    value = dig(props, *path)
    if value is None:
        raise UnpricedError(f"no {'.'.join(path)} to price it by")
    return value


def _quantity(value: object) -> float:
    """A Kubernetes quantity ("200Gi", "4", 4) as a number."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)", str(value))
    if not match or match[2] not in QUANTITY_UNITS:
        raise UnpricedError(f"{value!r} is not a quantity this pricing reads")
    return float(match[1]) * QUANTITY_UNITS[match[2]]


def _require_gp3(volume_type: object, prices: RegionPrices) -> None:
    """EBS gp3 is the one volume type the price files price."""
    if volume_type != "gp3":
        raise UnpricedError(
            f"EBS {volume_type or 'volume without a volumeType'} has no price in "
            f"infra/catalog/prices/{prices.region}.yaml (servicePrices.usd prices gp3)"
        )


def _gp3_size(volume: object, prices: RegionPrices) -> object:
    """The volumeSize of an EBS volume, which must be gp3."""
    _require_gp3(dig(volume, "volumeType"), prices)
    return dig(volume, "volumeSize") or 0


def _gp3_per_hour(gib: float, prices: RegionPrices) -> float:
    return gib * prices.ebs_gp3_per_gib_month / HOURS_PER_MONTH


def _control_plane(r: Declared, stack: Sequence[Declared], prices: RegionPrices) -> CostLine | None:
    # pulumi-eks's Cluster creates an aws:eks/cluster:Cluster, which a real preview shows too.
    if r.type == EKS_COMPONENT and any(other.type == EKS_CLUSTER for other in stack):
        return None
    return CostLine(
        f"EKS control plane {r.name}", "standard support", prices.eks_control_plane_per_hour
    )


def _nat_gateway(r: Declared, stack: Sequence[Declared], prices: RegionPrices) -> CostLine:
    return CostLine(f"NAT gateway {r.name}", "data processing extra", prices.nat_gateway_per_hour)


def _vpc_endpoint(r: Declared, stack: Sequence[Declared], prices: RegionPrices) -> CostLine:
    """An interface endpoint bills per hour in each AZ it has a network interface in (one per
    subnet); a gateway endpoint (S3), EC2's default type, has no hourly charge."""
    kind = dig(r.props, "vpcEndpointType") or "Gateway"
    service = str(dig(r.props, "serviceName")).rsplit(".", 1)[-1]
    if kind == "Gateway":
        return CostLine(f"VPC endpoint {r.name}", f"{service} gateway, free", 0.0)
    if kind != "Interface":
        raise UnpricedError(
            f"a {kind} VPC endpoint has no price in infra/catalog/prices/{prices.region}.yaml"
        )
    azs = len(listed(dig(r.props, "subnetIds")))
    return CostLine(
        f"VPC endpoint {r.name}",
        f"{service} interface in {azs} AZs",
        azs * prices.vpc_interface_endpoint_per_az_hour,
    )


def _node_group(r: Declared, stack: Sequence[Declared], prices: RegionPrices) -> CostLine:
    """maxSize nodes of the dearest type, each with its launch template's disks."""
    nodes = int(_required(r.props, "scalingConfig", "maxSize"))
    types = [str(t) for t in listed(dig(r.props, "instanceTypes"))]
    if not types:
        raise UnpricedError("no instanceTypes to price it by")
    templates = [d for d in stack if d.urn in r.dependencies and d.type == LAUNCH_TEMPLATE]
    disks = [dig(m, "ebs") for t in templates for m in listed(dig(t.props, "blockDeviceMappings"))]
    gib = sum(float(_gp3_size(disk, prices)) for disk in disks)  # GiB, as EC2 takes them
    dearest = max(types, key=prices.instance)
    per_node = prices.instance(dearest) + _gp3_per_hour(gib, prices)
    return CostLine(
        f"node group {r.name}", f"up to {nodes} x {dearest}, {gib:g} GiB gp3 each", nodes * per_node
    )


def _lustre(r: Declared, stack: Sequence[Declared], prices: RegionPrices) -> CostLine:
    kind = dig(r.props, "deploymentType")
    if kind != "PERSISTENT_2":
        raise UnpricedError(
            f"FSx for Lustre {kind} has no price in infra/catalog/prices/{prices.region}.yaml "
            "(servicePrices.usd prices PERSISTENT_2 SSD)"
        )
    gib = int(_required(r.props, "storageCapacity"))
    throughput = int(_required(r.props, "perUnitStorageThroughput"))
    return CostLine(
        f"FSx for Lustre {r.name}",
        f"{gib} GiB at {throughput} MB/s/TiB",
        gib * prices.fsx(throughput) / HOURS_PER_MONTH,
    )


def _instance(r: Declared, stack: Sequence[Declared], prices: RegionPrices) -> CostLine:
    kind = str(_required(r.props, "instanceType"))
    root = dig(r.props, "rootBlockDevice")
    # Without a volumeSize the root volume takes the AMI's size (a few GiB): not priced.
    gib = float(_gp3_size(root, prices)) if dig(root, "volumeSize") else 0.0
    return CostLine(
        f"EC2 instance {r.name}",
        f"{kind}, {gib:g} GiB gp3" if gib else kind,
        prices.instance(kind) + _gp3_per_hour(gib, prices),
    )


def _elastic_ip(r: Declared, stack: Sequence[Declared], prices: RegionPrices) -> CostLine:
    """A public IPv4 address bills per hour, attached or idle (since 2024-02-01). EC2 releases
    the hybrid gateway's launch-time public address when its Elastic IP attaches (EC2 User Guide,
    "Public IPv4 addresses"), so this line is the gateway's only address."""
    return CostLine(f"Elastic IP {r.name}", "public IPv4 address", prices.public_ipv4_per_hour)


def _listed_annotation(r: Declared, annotation: str) -> list:
    """A JSON list this program writes into a resource's annotation; [] where there is none."""
    raw = dig(r.props, "metadata", "annotations", annotation)
    if raw is None:
        return []
    try:
        return listed(json.loads(str(raw)))
    except json.JSONDecodeError:
        raise UnpricedError(f"its {annotation} annotation is not JSON") from None


def _reservations(node_class: Declared) -> list:
    return _listed_annotation(node_class, RESERVATIONS_ANNOTATION)


def _hybrid_nodes(r: Declared, stack: Sequence[Declared], prices: RegionPrices) -> CostLine | None:
    """EKS bills a joined hybrid node per vCPU-hour, in tiers by the account's monthly vCPU-hours;
    the first (dearest) tier's rate bounds it. The machines themselves are their owners' cost."""
    machines = _listed_annotation(r, HYBRID_MACHINES_ANNOTATION)
    if not machines:
        return None
    vcpu = sum(int(_required(m, "vcpu")) for m in machines)
    rate = prices.eks_hybrid_nodes_per_vcpu_hour
    return CostLine(
        HYBRID_NODES_ITEM,
        f"{len(machines)} machines, {vcpu} vCPU at ${rate}/vCPU-hour (first tier)",
        vcpu * rate,
    )


def _reserved_capacity(
    r: Declared, stack: Sequence[Declared], prices: RegionPrices
) -> CostLine | None:
    """A reservation bills every instance-hour it holds, used or not: a fixed cost, at the type's
    On-Demand rate for an ODCR. A Capacity Block is paid up front at purchase; its line is its
    instances at the On-Demand list price, which its fee is not."""
    entries = _reservations(r)
    if not entries:
        return None
    parts, per_hour = [], 0.0
    for entry in entries:
        kind, count = str(_required(entry, "instanceType")), int(_required(entry, "instanceCount"))
        per_hour += count * prices.instance(kind)
        block = dig(entry, "reservationType") == "capacity-block"
        what = "Capacity Block (prepaid; at list price)" if block else "ODCR"
        parts.append(f"{count} x {kind} {what}")
    name = dig(r.props, "metadata", "name") or r.name
    return CostLine(f"reserved {name}", f"{', '.join(parts)}, billed used or not", per_hour)


def _node_pool(r: Declared, stack: Sequence[Declared], prices: RegionPrices) -> CostLine:
    """limits.nodes of the dearest type it may launch, each with its node class's disks; nodes
    its class's reservations hold are priced on the reservation's line instead."""
    name = str(dig(r.props, "metadata", "name") or r.name)
    spec = dig(r.props, "spec", "template", "spec")
    types = [
        str(t)
        for requirement in listed(dig(spec, "requirements"))
        if dig(requirement, "key") == INSTANCE_TYPE_LABEL and dig(requirement, "operator") == "In"
        for t in listed(dig(requirement, "values"))
    ]
    nodes = dig(r.props, "spec", "limits", "nodes")
    if nodes is None or not types:
        unbounded = "no limits.nodes" if nodes is None else "no instance-type In requirement"
        return CostLine(name, unbounded, math.inf, node_pool=True)
    node_class = dig(spec, "nodeClassRef", "name")
    classes = [
        d for d in stack if d.type == NODECLASS and dig(d.props, "metadata", "name") == node_class
    ]
    disks = [
        dig(m, "ebs") for c in classes for m in listed(dig(c.props, "spec", "blockDeviceMappings"))
    ]
    gib = sum(_quantity(_gp3_size(disk, prices)) / 1024**3 for disk in disks)  # "200Gi"
    dearest = max(types, key=prices.instance)
    count = _quantity(nodes)
    reserved = sum(int(_required(e, "instanceCount")) for c in classes for e in _reservations(c))
    detail = f"{count:g} x {dearest}, {gib:g} GiB gp3 each"
    if reserved:
        detail += f", {reserved} of them reserved (their line)"
    # A static NodePool keeps its nodes running: always on, not a ceiling.
    static = dig(r.props, "spec", "replicas") is not None
    return CostLine(
        name,
        f"static, always on: {detail}" if static else detail,
        max(count - reserved, 0) * prices.instance(dearest) + count * _gp3_per_hour(gib, prices),
        node_pool=not static,
    )


def _storage_quota(r: Declared, stack: Sequence[Declared], prices: RegionPrices) -> CostLine | None:
    """The most the claims of an EBS gp3 StorageClass may hold in the namespace: its quota
    `<class>` + STORAGE_QUOTA_SUFFIX."""
    hard = dig(r.props, "spec", "hard") or {}
    storage = {
        key.removesuffix(STORAGE_QUOTA_SUFFIX): amount
        for key, amount in hard.items()
        if key.endswith(STORAGE_QUOTA_SUFFIX)
    }
    if not storage:
        return None
    meta = dig(r.props, "metadata")
    gib = 0.0
    for class_name, amount in storage.items():
        found = [
            d
            for d in stack
            if d.type == STORAGE_CLASS and dig(d.props, "metadata", "name") == class_name
        ]
        if not found or dig(found[0].props, "provisioner") != EBS_CSI:
            raise UnpricedError(f"storage class {class_name} is not an EBS class of this stack")
        _require_gp3(dig(found[0].props, "parameters", "type"), prices)
        gib += _quantity(amount) / 1024**3
    return CostLine(
        f"storage quota {dig(meta, 'namespace')}/{dig(meta, 'name')}",
        f"up to {gib:g} GiB of {', '.join(storage)} claims, in use or kept",
        _gp3_per_hour(gib, prices),
        quota=True,
    )


Pricer = Callable[[Declared, Sequence[Declared], RegionPrices], CostLine | None]
PRICERS: dict[str, Pricer] = {
    EKS_COMPONENT: _control_plane,
    EKS_CLUSTER: _control_plane,
    NAT_GATEWAY: _nat_gateway,
    VPC_ENDPOINT: _vpc_endpoint,
    NODE_GROUP: _node_group,
    LUSTRE: _lustre,
    INSTANCE: _instance,
    ELASTIC_IP: _elastic_ip,
    RESOURCE_FLAVOR: _hybrid_nodes,
    NODEPOOL: _node_pool,
    NODECLASS: _reserved_capacity,
    RESOURCE_QUOTA: _storage_quota,
}


def stack_cost(prices: RegionPrices, stack: Sequence[Declared]) -> StackCost:
    """Every priced resource of `stack` at its ceiling; what cannot be priced is named instead."""
    lines, unpriced = [], []
    for kind, pricer in PRICERS.items():
        for resource in (r for r in stack if r.type == kind):
            try:
                line = pricer(resource, stack, prices)
            except UnpricedError as e:
                unpriced.append(f"{resource.name}: {e}")
                continue
            if line is not None:
                lines.append(line)
    usage = [f"S3 ${prices.s3_standard_per_gib_month}/GiB-month"]
    if any(r.type == "aws:efs/fileSystem:FileSystem" for r in stack):
        usage.append(f"EFS ${prices.efs_standard_per_gib_month}/GiB-month")
    usage += [f"job volumes (gp3 ${prices.ebs_gp3_per_gib_month}/GiB-month)", "NAT data processing"]
    endpoint_types = [dig(r.props, "vpcEndpointType") for r in stack if r.type == VPC_ENDPOINT]
    if "Interface" in endpoint_types:
        usage.append("VPC endpoint data processing")
    if any(line.item == HYBRID_NODES_ITEM for line in lines):
        # In from the internet is free; out bills per GB (README: Hybrid nodes' costs).
        usage.append(
            f"hybrid machine-to-machine traffic out of the WireGuard gateway "
            f"${prices.internet_egress_per_gb}/GB"
        )
    usage.append("data transfer")
    return StackCost(prices, lines, unpriced, usage)


def plan_cost(region: str, plan: Plan) -> StackCost:
    return stack_cost(load_prices(region), declared_in(plan))
