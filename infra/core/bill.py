"""The lines of a bill as the pricers write them (infra/<integration>/facts.py) and the engine adds
them up (infra/core/cost.py): parts, lines, the price book that remembers which prices were read,
and the EBS gp3 volume every node and claim is priced by."""

import json
import math
from dataclasses import dataclass
from enum import Enum

from infra.core.catalog import HOURS_PER_MONTH, RegionPrices, ServicePrice, UnpricedError
from infra.core.declared import Declared, dig, listed, quantity

# gp3's included performance (EBS pricing): IOPS and MiB/s above these bill per month.
GP3_FREE_IOPS, GP3_FREE_MIBPS = 3000, 125


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


def sized(value: object) -> float:
    """A Kubernetes quantity the price depends on; one this cannot read leaves the line unpriced."""
    try:
        return quantity(value)
    except ValueError as e:
        raise UnpricedError(str(e)) from None


def required(props: object, *path: str) -> object:
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


def require_gp3(volume_type: object, book: PriceBook) -> None:
    """EBS gp3 is the one volume type the price files price."""
    if volume_type != "gp3":
        raise UnpricedError(
            f"EBS {volume_type or 'volume without a volumeType'} has no price in "
            f"{book.prices.file} (servicePrices price gp3)"
        )


def gp3_volume(volume: object, book: PriceBook, kubernetes: bool = False) -> Gp3:
    """A launch template's or node class's EBS mapping (volumeSize in GiB, or a quantity)."""
    require_gp3(dig(volume, "volumeType"), book)
    size = dig(volume, "volumeSize") or 0
    gib = sized(size) / 1024**3 if kubernetes else float(size)
    return Gp3(
        gib,
        int(dig(volume, "iops") or GP3_FREE_IOPS),
        int(dig(volume, "throughput") or GP3_FREE_MIBPS),
    )


def ebs_disks(mappings: list, book: PriceBook, kubernetes: bool = False) -> list[Gp3]:
    return [gp3_volume(dig(m, "ebs"), book, kubernetes) for m in mappings]


def describe_disks(disks: list[Gp3]) -> str:
    return " + ".join(d.describe() for d in disks) or "no EBS"


def listed_annotation(r: Declared, annotation: str) -> list:
    """A JSON list this program writes into a resource's annotation; [] where there is none."""
    raw = dig(r.props, "metadata", "annotations", annotation)
    if raw is None:
        return []
    try:
        return listed(json.loads(str(raw)))
    except json.JSONDecodeError:
        raise UnpricedError(f"its {annotation} annotation is not JSON") from None
