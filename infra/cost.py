"""What a stack costs at list prices in its region: always-on baseline plus NodePool ceilings.

Fixed-rate items only (per hour or per provisioned GiB); usage-priced ones (S3 and EFS storage,
data transfer, NAT data processing, job volumes) are named with their unit price, not guessed.
"""

from dataclasses import dataclass

from infra.catalog import HOURS_PER_MONTH, RegionPrices, load_prices
from infra.config import StackConfig
from infra.offline import Plan

NAT_GATEWAY = "aws:ec2/natGateway:NatGateway"
VPC_ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"


@dataclass(frozen=True)
class CostLine:
    item: str
    detail: str
    usd_per_hour: float


@dataclass(frozen=True)
class StackCost:
    prices: RegionPrices
    baseline: list[CostLine]  # billed from `pulumi up` on, whether or not a job runs
    pools: list[CostLine]  # each NodePool at its ceiling (maxNodes of its dearest type)
    usage_priced: list[str]

    @property
    def baseline_per_hour(self) -> float:
        return sum(line.usd_per_hour for line in self.baseline)

    @property
    def pools_per_hour(self) -> float:
        return sum(line.usd_per_hour for line in self.pools)

    @property
    def total_per_hour(self) -> float:
        return self.baseline_per_hour + self.pools_per_hour


def stack_cost(config: StackConfig, plan: Plan) -> StackCost:
    prices = load_prices(config.region)
    system = config.cluster.system_node_group
    nats = len(plan.of_type(NAT_GATEWAY))
    baseline = [
        CostLine("EKS control plane", "standard support", prices.eks_control_plane_per_hour),
        CostLine(
            "NAT gateways", f"{nats}, data processing extra", nats * prices.nat_gateway_per_hour
        ),
        CostLine(
            "system nodes",
            f"{system.desired_size} x {system.instance_type}",
            system.desired_size * prices.instance(system.instance_type),
        ),
        CostLine(
            "system node disks",
            f"{system.desired_size} x {system.disk_size_gib} GiB gp3",
            system.desired_size
            * system.disk_size_gib
            * prices.ebs_gp3_per_gib_month
            / HOURS_PER_MONTH,
        ),
    ]
    fsx = config.storage.fsx
    endpoints = plan.of_type(VPC_ENDPOINT)
    interface = [e for e in endpoints if e.inputs["vpcEndpointType"] == "Interface"]
    if endpoints:
        baseline.append(vpc_endpoints_line(endpoints, prices))
    if fsx.enabled:
        monthly = fsx.storage_capacity_gib * prices.fsx(fsx.throughput_per_tib)
        baseline.append(
            CostLine(
                "FSx for Lustre",
                f"{fsx.storage_capacity_gib} GiB at {fsx.throughput_per_tib} MB/s/TiB",
                monthly / HOURS_PER_MONTH,
            )
        )
    pools = [
        CostLine(
            p.name,
            f"{p.max_nodes} x {max(p.instance_types, key=prices.instance)}",
            p.max_usd_per_hour(prices),
        )
        for p in config.node_pools
    ]
    usage = [f"S3 ${prices.s3_standard_per_gib_month}/GiB-month"]
    if config.storage.efs.enabled:
        usage.append(f"EFS ${prices.efs_standard_per_gib_month}/GiB-month")
    usage += [
        f"job volumes (gp3 ${prices.ebs_gp3_per_gib_month}/GiB-month)",
        "NAT data processing",
        *(["VPC endpoint data processing"] if interface else []),
        "data transfer",
    ]
    return StackCost(prices, baseline, pools, usage)


def vpc_endpoints_line(endpoints: list, prices: RegionPrices) -> CostLine:
    """Interface endpoints bill per hour in each AZ they have a network interface in (one per
    subnet); gateway endpoints (S3) have no hourly charge."""
    interface = [e for e in endpoints if e.inputs["vpcEndpointType"] == "Interface"]
    gateways = [e.inputs["serviceName"].rsplit(".", 1)[1] for e in endpoints if e not in interface]
    details = []
    if interface:
        details.append(f"{len(interface)} interface in {len(interface[0].inputs['subnetIds'])} AZs")
    if gateways:
        details.append(f"{', '.join(gateways)} gateway (free)")
    az_hours = sum(len(e.inputs["subnetIds"]) for e in interface)
    return CostLine(
        "VPC endpoints", ", ".join(details), az_hours * prices.vpc_interface_endpoint_per_az_hour
    )
