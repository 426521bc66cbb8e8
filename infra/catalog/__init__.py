"""The EC2 instance catalog: one data file saying what each instance type offers and costs."""

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

CATALOG_FILE = Path(__file__).with_name("instance_types.yaml")


@dataclass(frozen=True)
class InstanceType:
    name: str
    vcpu: int
    memory_gib: int
    gpus: int
    gpu_model: str | None
    gpu_memory_gib: int
    efa_network_cards: int  # 0: no EFA
    usd_per_hour: float

    @property
    def efa(self) -> bool:
        return self.efa_network_cards > 0


@dataclass(frozen=True)
class Catalog:
    types: dict[str, InstanceType]
    price_source: str
    price_as_of: str

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
            vcpu, memory_gib, price, gpus = (*figures, 0) if len(figures) == 3 else figures
            name = f"{family}.{size}"
            types[name] = InstanceType(
                name=name,
                vcpu=vcpu,
                memory_gib=memory_gib,
                gpus=gpus,
                gpu_model=spec["gpuModel"],
                gpu_memory_gib=spec.get("gpuMemoryGiB", 0),
                efa_network_cards=spec["efa"].get(size, 0),
                usd_per_hour=price,
            )
    return Catalog(types=types, price_source=raw["priceSource"], price_as_of=raw["priceAsOf"])


@dataclass(frozen=True)
class StoragePrices:
    fsx_per_gib_month: dict[int, float]  # PERSISTENT_2 SSD, by throughput per TiB
    price_source: str
    price_as_of: str


@cache
def load_storage_prices() -> StoragePrices:
    raw = yaml.safe_load(CATALOG_FILE.with_name("storage_prices.yaml").read_text())
    return StoragePrices(
        fsx_per_gib_month={int(k): float(v) for k, v in raw["fsxPersistent2PerGibMonth"].items()},
        price_source=raw["priceSource"],
        price_as_of=raw["priceAsOf"],
    )
