"""What the platform knows about Karpenter's kinds: a NodePool bills at its ceiling (or always,
when static), an EC2NodeClass for the reservations it holds, and add-on pods the system nodes
refuse keep a pool's nodes up; its interruption queue bills per request; the pods of its chart."""

import math
from collections.abc import Sequence

from infra.core.bill import (
    CostLine,
    Gp3,
    Part,
    PriceBook,
    describe_disks,
    ebs_disks,
    listed_annotation,
    required,
    sized,
)
from infra.core.capacity import allocatable, system_fit
from infra.core.catalog import UnpricedError
from infra.core.declared import Declared, dig, listed
from infra.core.facts import TF, Facts, ImmutableRule, Kind, ReplaceRule
from infra.core.nodes import SYSTEM_NODE_LABEL
from infra.core.pods import CRITICAL_ADDONS, SYSTEM_LABELS, ChartPods, PodSet, Requests, tolerates

NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
NODECLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
# What an EC2NodeClass's capacity reservations hold (JSON: a list of {instanceType,
# instanceCount, reservationType, durationHours?, upfrontFeeUsd?, id or tags}), written by
# infra/karpenter/node_pools.py.
RESERVATIONS_ANNOTATION = "training-platform/capacity-reservations"


def reservations(node_class: Declared) -> list:
    return listed_annotation(node_class, RESERVATIONS_ANNOTATION)


def _capacity_block(entry: object, kind: str, count: int, book: PriceBook) -> tuple[float, str]:
    """A block's hourly rate while held, and how it was priced: its own fee, else the region's
    published block rate. Paid up front for its whole length, used or not."""
    hours = int(required(entry, "durationHours"))
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
        kind, count = str(required(entry, "instanceType")), int(required(entry, "instanceCount"))
        if dig(entry, "reservationType") == "capacity-block":
            rate, detail = _capacity_block(entry, kind, count, book)
            hours = float(required(entry, "durationHours"))
            item = f"capacity block {name} {len(lines) + 1}"
            lines.append(CostLine(item, detail, count * rate, hours=hours))
        else:
            odcr_per_hour += count * book.instance(kind)
            odcr_parts.append(f"{count} x {kind} ODCR")
    if odcr_parts:
        detail = f"{', '.join(odcr_parts)}, billed used or not"
        lines.insert(0, CostLine(f"reserved {name}", detail, odcr_per_hour))
    return lines


def allowed(spec: object, key: str) -> list[str]:
    """The values of `key` a NodePool template's requirements allow (its In requirement)."""
    return [
        str(t)
        for requirement in listed(dig(spec, "requirements"))
        if dig(requirement, "key") == key and dig(requirement, "operator") == "In"
        for t in listed(dig(requirement, "values"))
    ]


def pool_types(spec: object) -> list[str]:
    """The instance types a NodePool template's requirements allow (its In requirement)."""
    return allowed(spec, INSTANCE_TYPE_LABEL)


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
    return ebs_disks(mappings, book, kubernetes=True)


def reserved_count(classes: list[Declared]) -> int:
    return sum(int(required(e, "instanceCount")) for c in classes for e in reservations(c))


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
    count = sized(nodes)
    reserved = reserved_count(classes)
    detail = f"{count:g} x {dearest}, {describe_disks(disks)} each"
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


def stray_pool_lines(stack: Sequence[Declared], book: PriceBook, facts: Facts) -> list[CostLine]:
    """Add-on pods the system nodes refuse (infra/core/capacity.py) land on a dynamic pool that
    accepts them, on its cheapest type, and keep those nodes running: floor, not ceiling."""
    fit = system_fit(stack, facts)
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
            f"{nodes} x {kind}, {describe_disks(disks)}, kept up by {names}",
            nodes * (price + sum(d.per_hour(book) for d in disks)),
        )
    ]


KINDS = (
    Kind(
        NODEPOOL,
        price=_node_pool,
        immutable=ImmutableRule(
            ("spec.template.spec.nodeClassRef.group", "spec.template.spec.nodeClassRef.kind"),
            "Karpenter v1 CRD karpenter.sh_nodepools.yaml, spec: has(self.replicas) == "
            "has(oldSelf.replicas); nodeClassRef group and kind",
            "a pool switched between static and dynamic nodes goes in one `pulumi up` (its nodes "
            "drain; remove its jobs and flavors first) and comes back in the next",
            presence=("spec.replicas",),
        ),
    ),
    Kind(NODECLASS, price=_reserved_capacity),
    Kind(
        "aws:sqs/queue:Queue",
        usage="SQS per million requests after the first million a month",
        replace=ReplaceRule(("name", "namePrefix", "fifoQueue"), f"{TF}/sqs/queue.go"),
    ),
    Kind("aws:sqs/queuePolicy:QueuePolicy", free="queue configuration"),
    Kind(
        "aws:cloudwatch/eventRule:EventRule",
        free="EventBridge: events AWS services send to the default "
        "bus are free (these match EC2 and AWS Health events; EventBridge pricing, from "
        "memory)",
    ),
    Kind("aws:cloudwatch/eventTarget:EventTarget", free="EventBridge: part of its rule"),
    Kind(
        "aws:ec2/placementGroup:PlacementGroup",
        free="EC2: no charge for placement groups (from memory)",
    ),
)


CHARTS = {
    "oci://public.ecr.aws/karpenter/karpenter": [
        ChartPods(
            "controller",
            "",
            "controller.resources",
            Requests(),
            "aws/karpenter-provider-aws charts/karpenter/values.yaml (v1.14.1, main 1d927085): {}",
            replicas="replicas",
            default_replicas=2,
            default_selector={"kubernetes.io/os": "linux"},
            default_tolerations=CRITICAL_ADDONS,
        )
    ],
    "oci://public.ecr.aws/karpenter/karpenter-crd": [],
}
