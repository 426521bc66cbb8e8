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


@dataclass(frozen=True)
class RegionPrices:
    """List prices in one region (USD): instances per hour, services per hour or GiB-month."""

    region: str
    instance_usd_per_hour: dict[str, float]
    instance_source: str
    instance_as_of: str
    eks_control_plane_per_hour: float
    nat_gateway_per_hour: float
    vpc_interface_endpoint_per_az_hour: float
    ebs_gp3_per_gib_month: float
    efs_standard_per_gib_month: float
    s3_standard_per_gib_month: float
    fsx_per_gib_month: dict[int, float]  # PERSISTENT_2 SSD, by throughput per TiB
    public_ipv4_per_hour: float  # each public IPv4 address, Elastic IPs included
    eks_hybrid_nodes_per_vcpu_hour: float  # the first tier
    internet_egress_per_gb: float  # data transfer out to the internet, the first tier
    service_source: str
    service_as_of: str

    def instance(self, name: str) -> float:
        if name not in self.instance_usd_per_hour:
            raise UnpricedError(
                f"{name} has no {self.region} price in infra/catalog/prices/{self.region}.yaml; "
                f"priced there: {', '.join(sorted(self.instance_usd_per_hour))} "
                f"(add it: .venv/bin/python -m infra.catalog.refresh --region {self.region})"
            )
        return self.instance_usd_per_hour[name]

    def fsx(self, throughput_per_tib: int) -> float:
        if throughput_per_tib not in self.fsx_per_gib_month:
            raise UnpricedError(
                f"FSx for Lustre at {throughput_per_tib} MB/s/TiB has no {self.region} price in "
                f"infra/catalog/prices/{self.region}.yaml (servicePrices.usd."
                "fsxPersistent2PerGibMonth)"
            )
        return self.fsx_per_gib_month[throughput_per_tib]


def supported_regions() -> list[str]:
    return sorted(p.stem for p in PRICES_DIR.glob("*.yaml"))


@cache
def load_prices(region: str) -> RegionPrices:
    """The region's prices; UnpricedError naming the supported regions for any other region."""
    path = PRICES_DIR / f"{region}.yaml"
    if not path.is_file():
        raise UnpricedError(
            f"no prices for region {region!r} in infra/catalog/prices/; supported regions: "
            f"{', '.join(supported_regions())} (add one: .venv/bin/python -m infra.catalog.refresh "
            f"--region {region}, then its servicePrices by hand)"
        )
    raw = yaml.safe_load(path.read_text())
    instances, services = raw["instancePrices"], raw["servicePrices"]
    usd = services["usd"]
    return RegionPrices(
        region=region,
        instance_usd_per_hour={k: float(v) for k, v in instances["usdPerHour"].items()},
        instance_source=instances["source"],
        instance_as_of=str(instances["asOf"]),
        eks_control_plane_per_hour=float(usd["eksControlPlanePerHour"]),
        nat_gateway_per_hour=float(usd["natGatewayPerHour"]),
        vpc_interface_endpoint_per_az_hour=float(usd["vpcInterfaceEndpointPerAzHour"]),
        ebs_gp3_per_gib_month=float(usd["ebsGp3PerGibMonth"]),
        efs_standard_per_gib_month=float(usd["efsStandardPerGibMonth"]),
        s3_standard_per_gib_month=float(usd["s3StandardPerGibMonth"]),
        fsx_per_gib_month={int(k): float(v) for k, v in usd["fsxPersistent2PerGibMonth"].items()},
        public_ipv4_per_hour=float(usd["publicIpv4PerHour"]),
        eks_hybrid_nodes_per_vcpu_hour=float(usd["eksHybridNodesPerVcpuHour"]),
        internet_egress_per_gb=float(usd["internetEgressPerGb"]),
        service_source=services["source"],
        service_as_of=str(services["asOf"]),
    )
