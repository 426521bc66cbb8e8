"""What a stack costs per hour with its declared jobs running: between the floor and the ceiling.

`pulumi up` starts every job the stack declares at once. Each job's workers take a node each of
their pool (the job pods ask for a node's room, workloads/manifests.py); a pool runs at most its
limits.nodes (Kueue's quota is the same ceiling, so jobs beyond it wait their turn). Pools no job
uses stay empty (Karpenter launches nodes only for pending pods and consolidates empty ones).
Nodes a reservation or a static pool holds are already in the floor and add nothing. Each node is
priced at the cheapest type its pool allows (Karpenter picks the cheapest offering that fits), at
the region's spot estimate where the pool may use spot (spotPrices: the highest AZ's price in a
public dataset, with its date), else On-Demand; the On-Demand figure is given beside it as the
bound when spot capacity is not there. A pool held to one AZ and one cluster placement group (EFA)
is priced On-Demand: spot for many such nodes together is the best case, not the expected one.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from infra.core.bill import StackCost
from infra.core.declared import Declared, dig, quantity
from infra.jobs.declared import declared_jobs
from infra.karpenter.facts import (
    NODEPOOL,
    node_class_of,
    node_disks,
    pool_capacity_types,
    pool_types,
    reserved_count,
)


@dataclass(frozen=True)
class PoolRun:
    pool: str
    jobs: list[str]
    asked: int  # nodes the pool's jobs ask for together
    nodes: int  # what runs: asked, at most the pool's limits.nodes
    billed: int  # of them, not already in the floor (reservations, static nodes)
    instance_type: str
    spot_allowed: bool
    spot: (
        float | None
    )  # the spot estimate per node-hour, where the pool may use spot and one is known
    on_demand: float  # per node-hour
    disks: float  # per node-hour
    packed: bool = False  # one AZ, one cluster placement group: spot is the best case

    @property
    def per_hour(self) -> float:
        spot = self.spot is not None and not self.packed
        return self.billed * ((self.spot if spot else self.on_demand) + self.disks)

    @property
    def on_demand_per_hour(self) -> float:
        return self.billed * (self.on_demand + self.disks)


@dataclass(frozen=True)
class Expected:
    floor: float
    pools: list[PoolRun]

    @property
    def per_hour(self) -> float:
        return self.floor + sum(p.per_hour for p in self.pools)

    @property
    def on_demand_per_hour(self) -> float:
        return self.floor + sum(p.on_demand_per_hour for p in self.pools)


def expected_cost(cost: StackCost, stack: Sequence[Declared]) -> Expected:
    book = cost.book
    pools = {
        str(dig(r.props, "metadata", "name") or r.name): r for r in stack if r.type == NODEPOOL
    }
    runs = []
    for name, pool in pools.items():
        jobs = [j for j in declared_jobs(stack) if j.pool == name]
        if not jobs:
            continue
        spec = dig(pool.props, "spec", "template", "spec")
        limit = dig(pool.props, "spec", "limits", "nodes")
        asked = sum(j.nodes for j in jobs)
        nodes = min(asked, int(quantity(limit))) if limit is not None else asked
        classes = node_class_of(pool, stack)
        held = reserved_count(classes)
        if dig(pool.props, "spec", "replicas") is not None:
            held = int(dig(pool.props, "spec", "replicas"))
        kind = min(pool_types(spec), key=book.instance)
        spot = "spot" in pool_capacity_types(spec)
        runs.append(
            PoolRun(
                name,
                [j.name for j in jobs],
                asked,
                nodes,
                max(nodes - held, 0),
                kind,
                spot,
                cost.prices.spot_usd_per_hour.get(kind) if spot else None,
                book.instance(kind),
                sum(d.per_hour(book) for d in node_disks(classes, book)),
                any(dig(c.props, "spec", "placementGroupSelector") for c in classes),
            )
        )
    return Expected(cost.baseline_per_hour, runs)
