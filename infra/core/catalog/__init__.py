"""The EC2 instance catalog and per-region prices: what each type offers and what it costs where.

`instance_types.yaml` holds what a type is (vCPU, memory, GPUs, EFA); `prices/<region>.yaml` what
it and the always-on services cost in one region, with where and when the figures were read.
"""

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

CATALOG_FILE = Path(__file__).with_name("instance_types.yaml")
PUBLISHED_BUSBW_FILE = Path(__file__).with_name("nccl_busbw.yaml")
PRICES_DIR = Path(__file__).with_name("prices")
HOURS_PER_MONTH = 730  # AWS's own convention for monthly estimates


@dataclass(frozen=True)
class InstanceType:
    name: str
    vcpu: int
    memory_gib: int
    gpus: int
    gpu_model: str | None
    gpu_memory_gib: int
    efa_network_cards: int  # 0: no EFA
    nvme_disks: int  # NVMe instance store disks; 0: none (EBS only)
    nvme_gb_per_disk: int
    network_gbps: float  # baseline, not burst
    network_topology: bool = False  # nodes carry topology.k8s.aws/network-node-layer-1..3

    @property
    def efa(self) -> bool:
        return self.efa_network_cards > 0

    @property
    def family(self) -> str:
        return self.name.split(".")[0]

    @property
    def nvme(self) -> bool:
        return self.nvme_disks > 0


@dataclass(frozen=True)
class Catalog:
    types: dict[str, InstanceType]

    def __getitem__(self, name: str) -> InstanceType:
        return self.types[name]

    def __contains__(self, name: object) -> bool:
        return name in self.types

    def names(self, gpu: bool | None = None) -> list[str]:
        """Sorted type names; gpu=True/False keeps only GPU/CPU types."""
        return sorted(n for n, t in self.types.items() if gpu is None or (t.gpus > 0) == gpu)


@cache
def load_catalog() -> Catalog:
    raw = yaml.safe_load(CATALOG_FILE.read_text())
    types: dict[str, InstanceType] = {}
    for family, spec in raw["families"].items():
        for size, figures in spec["types"].items():
            vcpu, memory_gib, gpus = (*figures, 0) if len(figures) == 2 else figures
            name = f"{family}.{size}"
            nvme_disks, nvme_gb = spec["nvme"].get(size, (0, 0))
            types[name] = InstanceType(
                name=name,
                vcpu=vcpu,
                memory_gib=memory_gib,
                gpus=gpus,
                gpu_model=spec["gpuModel"],
                gpu_memory_gib=spec.get("gpuMemoryGiB", 0),
                efa_network_cards=spec["efa"].get(size, 0),
                nvme_disks=nvme_disks,
                nvme_gb_per_disk=nvme_gb,
                network_gbps=float(spec["networkGbps"][size]),
                network_topology=spec.get("networkTopology", False),
            )
    return Catalog(types=types)


@dataclass(frozen=True)
class PublishedBusbw:
    """An all_reduce_perf result someone published for an instance family (nccl_busbw.yaml)."""

    family: str
    nodes: int
    bytes: int  # the message size it was measured at
    busbw: float  # GB/s, out-of-place, as all_reduce_perf prints it
    nccl: str | None
    source: str


@cache
def load_published_busbw() -> dict[str, PublishedBusbw]:
    """Instance family -> its published two-node figure; families without one are absent."""
    raw = yaml.safe_load(PUBLISHED_BUSBW_FILE.read_text())
    return {
        family: PublishedBusbw(
            family=family,
            nodes=int(entry["nodes"]),
            bytes=int(entry["bytes"]),
            busbw=float(entry["busbw"]),
            nccl=entry["nccl"],
            source=entry["source"],
        )
        for family, entry in raw["families"].items()
    }


class UnpricedError(LookupError):
    """The catalog holds no price for this region or item: say which and how to add one."""


# `sources` keys of prices no source confirmed: the plan lists such prices as unverified.
FROM_MEMORY = "from-memory"
COPIED = "copied-from-us-east-1"  # a new region's service prices, written by refresh
OUTDATED = "outdated-"  # a source whose figures AWS has changed since it was read


@dataclass(frozen=True)
class ServicePrice:
    """One service's list price in USD (the unit is in its key's name), and where it was read."""

    key: str
    usd: float
    source: str  # the `sources` entry's text

    @property
    def unverified(self) -> bool:
        return self.source_key in (FROM_MEMORY, COPIED) or self.source_key.startswith(OUTDATED)

    @property
    def source_key(self) -> str:
        return self.source.split(":", 1)[0]


@dataclass(frozen=True)
class RegionPrices:
    """List prices in one region (USD): instances per hour, services per their keys' units."""

    region: str
    instance_usd_per_hour: dict[str, float]
    instance_source: str
    instance_as_of: str
    not_offered: dict[str, str]  # instance type -> why the region does not sell it On-Demand
    spot_usd_per_hour: dict[str, float]  # the highest AZ's spot price in the dataset
    spot_source: str
    capacity_block_usd_per_hour: dict[str, ServicePrice]  # published effective instance-hour rate
    services: dict[str, ServicePrice]

    @property
    def file(self) -> str:
        return f"infra/core/catalog/prices/{self.region}.yaml"

    def instance(self, name: str) -> float:
        if name in self.not_offered:
            raise UnpricedError(f"{name} is not offered in {self.region}: {self.not_offered[name]}")
        if name not in self.instance_usd_per_hour:
            raise UnpricedError(
                f"{name} has no {self.region} price in {self.file}; "
                f"priced there: {', '.join(sorted(self.instance_usd_per_hour))} "
                f"(add it: .venv/bin/python -m infra.core.catalog.refresh --region {self.region})"
            )
        return self.instance_usd_per_hour[name]

    def service(self, key: str) -> ServicePrice:
        if key not in self.services:
            raise UnpricedError(f"{self.file} has no servicePrices.{key}")
        return self.services[key]

    def usd(self, key: str) -> float:
        return self.service(key).usd

    def fsx_key(self, throughput_per_tib: int) -> str:
        """The key of FSx for Lustre PERSISTENT_2 SSD storage at this throughput, per GiB-month."""
        key = f"fsxPersistent2Ssd{throughput_per_tib}PerGibMonth"
        if key not in self.services:
            raise UnpricedError(
                f"FSx for Lustre at {throughput_per_tib} MB/s/TiB has no {self.region} price in "
                f"{self.file} (servicePrices.{key})"
            )
        return key


def supported_regions() -> list[str]:
    return sorted(p.stem for p in PRICES_DIR.glob("*.yaml"))


@cache
def load_prices(region: str) -> RegionPrices:
    """The region's prices; UnpricedError naming the supported regions for any other region."""
    path = PRICES_DIR / f"{region}.yaml"
    if not path.is_file():
        raise UnpricedError(
            f"no prices for region {region!r} in infra/core/catalog/prices/; supported regions: "
            f"{', '.join(supported_regions())} (add one: .venv/bin/python -m "
            "infra.core.catalog.refresh "
            f"--region {region}, then its servicePrices by hand)"
        )
    raw = yaml.safe_load(path.read_text())
    sources, instances, spot = raw["sources"], raw["instancePrices"], raw["spotPrices"]

    def priced(key: str, entry: dict) -> ServicePrice:
        return ServicePrice(
            key, float(entry["usd"]), f"{entry['source']}: {sources[entry['source']]}"
        )

    return RegionPrices(
        region=region,
        instance_usd_per_hour={k: float(v) for k, v in instances["usdPerHour"].items()},
        instance_source=instances["source"],
        instance_as_of=str(instances["asOf"]),
        not_offered=dict(instances.get("notOffered") or {}),
        spot_usd_per_hour={k: float(v) for k, v in spot["usdPerHour"].items()},
        spot_source=f"{spot['source']}: {sources[spot['source']]}",
        capacity_block_usd_per_hour={
            k: priced(f"capacityBlock {k}", v) for k, v in raw["capacityBlockPrices"].items()
        },
        services={k: priced(k, v) for k, v in raw["servicePrices"].items()},
    )
