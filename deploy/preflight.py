"""GPU availability preflight: would AWS actually give this stack the capacity its pools declare?

`.venv/bin/python -m deploy.preflight --stack dev` reads Pulumi.<stack>.yaml and asks AWS
(read-only calls, the caller's credentials) four things before `pulumi up` schedules pools and
jobs:
- EC2 vCPU service quotas per quota bucket (Standard, G/VT, P, P5; on-demand and spot), against
  the sum of the pools' ceilings (maxNodes x largest type) plus the system node group;
- instance type offerings in the stack's availability zones;
- recent spot prices for spot pools (a type with no spot price in any zone has no spot market);
- the pools' capacity reservations: they exist, are active (a Capacity Block may still be
  scheduled), and hold the instance type, count and zone the stack file says;
- the EKS add-on builds pinned for the stack's Kubernetes version (infra/core/versions.py): offered
  for that version, and whether each is EKS's default there; and the CSI add-ons' configuration
  keys (infra/storage/csi_addons.py) in each build's configuration schema (CreateAddon refuses
  the rest);
- the AL2023 release of Karpenter's nodes (`karpenter.amiAlias`): it has the AMIs the pools need
  for the stack's Kubernetes version, as Karpenter finds them (SSM public parameters).
It prints one line per finding and exits 1 when something is not satisfiable.
"""

import argparse
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from infra.core.catalog import load_catalog, load_prices
from infra.core.config import ConfigError
from infra.core.versions import KUBERNETES_VERSIONS
from infra.karpenter.config import CapacityReservation
from infra.stack.config import StackConfig
from infra.stack.loading import load_stack_file
from infra.storage.csi_addons import addon_configuration, key_paths, schema_lacks


@dataclass(frozen=True)
class QuotaBucket:
    code: str
    name: str


# EC2 vCPU quotas (service code ec2), by instance family and capacity type. G and VT share one
# bucket; P5-family spot has its own bucket, P5 on-demand shares "Running On-Demand P instances".
QUOTAS = {
    ("standard", "on-demand"): QuotaBucket(
        "L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"
    ),
    ("standard", "spot"): QuotaBucket(
        "L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"
    ),
    ("g", "on-demand"): QuotaBucket("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("g", "spot"): QuotaBucket("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("p", "on-demand"): QuotaBucket("L-417A185B", "Running On-Demand P instances"),
    ("p", "spot"): QuotaBucket("L-7212CCBC", "All P4, P3 and P2 Spot Instance Requests"),
    ("p5", "on-demand"): QuotaBucket("L-417A185B", "Running On-Demand P instances"),
    ("p5", "spot"): QuotaBucket("L-C4BD4855", "All P5 Spot Instance Requests"),
}
FAMILY_BUCKETS = [
    (r"p5[a-z]*", "p5"),
    (r"p\d+[a-z]*", "p"),
    (r"(g|vt)\d+[a-z]*", "g"),
    (r"[acdhimrtz]\d+[a-z]*", "standard"),
]
SPOT_PRODUCT = "Linux/UNIX"
# Karpenter launches Linux instances with default tenancy and lists only `active` reservations
# (karpenter-provider-aws at KARPENTER_CHART, pkg/providers/capacityreservation/types.go); a
# Capacity Block is `scheduled` until its start date (EC2 API, CapacityReservation.State).
RESERVATION_PLATFORM = "Linux/UNIX"
RESERVATION_TENANCY = "default"
SPOT_LOOKBACK = timedelta(days=1)


def quota_bucket(instance_type: str, capacity_type: str) -> QuotaBucket:
    family = instance_type.split(".")[0]
    # Reserved instances count against the On-Demand vCPU quota (EC2 user guide, "Capacity
    # Reservations": a reservation is limited by the account's On-Demand Instance quota).
    market = "on-demand" if capacity_type == "reserved" else capacity_type
    for pattern, bucket in FAMILY_BUCKETS:
        if re.fullmatch(pattern, family):
            return QUOTAS[(bucket, market)]
    raise ValueError(f"{instance_type}: no EC2 vCPU quota bucket known for family {family!r}")


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)  # not satisfiable: exit 1
    warnings: list[str] = field(default_factory=list)  # satisfiable, but narrower than declared
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return (
            [f"ERROR {line}" for line in self.problems]
            + [f"WARN  {line}" for line in self.warnings]
            + [f"ok    {line}" for line in self.notes]
        )


def stack_zones(config: StackConfig, ec2) -> list[str]:
    """The AZs the stack's subnets are in: as infra/vpc/network.py picks them."""
    existing = config.network.existing_vpc
    if existing:
        subnets = ec2.describe_subnets(SubnetIds=existing.private_subnet_ids)["Subnets"]
        return sorted({s["AvailabilityZone"] for s in subnets})
    zones = ec2.describe_availability_zones(Filters=[{"Name": "state", "Values": ["available"]}])
    names = [z["ZoneName"] for z in zones["AvailabilityZones"] if z.get("ZoneType") != "local-zone"]
    return sorted(names)[: config.network.az_count]


def vcpu_needed(config: StackConfig) -> dict[QuotaBucket, dict[str, int]]:
    """vCPUs each quota bucket must hold, per pool (and the system node group).

    A pool listing both capacity types may land wholly on either (Karpenter falls back to
    on-demand when spot runs dry), so its whole ceiling counts against each listed type.
    """
    catalog = load_catalog()
    needed: dict[QuotaBucket, dict[str, int]] = defaultdict(dict)
    system = config.cluster.system_node_group
    system_bucket = quota_bucket(system.instance_type, "on-demand")
    needed[system_bucket]["system node group"] = (
        system.max_size * catalog[system.instance_type].vcpu
    )
    for pool in config.node_pools:
        for capacity_type in pool.capacity_types:
            per_bucket: dict[QuotaBucket, int] = defaultdict(int)
            for t in pool.types:
                bucket = quota_bucket(t.name, capacity_type)
                per_bucket[bucket] = max(per_bucket[bucket], pool.max_nodes * t.vcpu)
            for bucket, vcpu in per_bucket.items():
                needed[bucket][pool.name] = max(needed[bucket].get(pool.name, 0), vcpu)
    return needed


def quota_value(quotas, code: str) -> float:
    """The applied quota; an account that never changed it has only the AWS default."""
    try:
        return quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
    except ClientError as e:
        if e.response["Error"]["Code"] != "NoSuchResourceException":
            raise
    return quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]


def check_quotas(config: StackConfig, quotas, report: Report) -> None:
    for bucket, users in sorted(vcpu_needed(config).items(), key=lambda kv: kv[0].code):
        have = int(quota_value(quotas, bucket.code))
        total = sum(users.values())
        who = ", ".join(users)
        line = f"{who}: quota {have} vCPU of {total} needed ({bucket.code} {bucket.name})"
        (report.problems if have < total else report.notes).append(line)


def check_offerings(config: StackConfig, ec2, zones: list[str], report: Report) -> None:
    for pool in config.node_pools:
        if pool.efa:
            check_efa_zone(pool, ec2, zones, report)
            continue
        offered = offerings(ec2, pool.instance_types, zones)
        for name in pool.instance_types:
            missing = [z for z in zones if z not in offered[name]]
            if missing:
                report.warnings.append(f"{pool.name}: {name} not offered in {', '.join(missing)}")
        if not any(offered[name] for name in pool.instance_types):
            report.problems.append(
                f"{pool.name}: none of {', '.join(pool.instance_types)} is offered in "
                f"{', '.join(zones)}"
            )


def offerings(ec2, instance_types: list[str], zones: list[str]) -> dict[str, set[str]]:
    """The zones among `zones` where each instance type is offered."""
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone",
        Filters=[
            {"Name": "instance-type", "Values": instance_types},
            {"Name": "location", "Values": zones},
        ],
    )
    offered = defaultdict(set)
    for page in pages:
        for offering in page["InstanceTypeOfferings"]:
            offered[offering["InstanceType"]].add(offering["Location"])
    return offered


def check_efa_zone(pool, ec2, zones: list[str], report: Report) -> None:
    """An EFA pool launches only in its one zone: every type must be offered there."""
    zone = pool.availability_zone
    if zone not in zones:
        report.problems.append(
            f"{pool.name}: availabilityZone {zone} has no subnet of this stack ({', '.join(zones)})"
        )
        return
    offered = offerings(ec2, pool.instance_types, [zone])
    for name in pool.instance_types:
        if zone in offered[name]:
            report.notes.append(f"{pool.name}: {name} offered in {zone}, the pool's zone")
        else:
            report.problems.append(f"{pool.name}: {name} not offered in {zone}, the pool's zone")


def check_spot(config: StackConfig, ec2, zones: list[str], report: Report) -> None:
    prices = load_prices(config.region)  # config validation made sure every pool type is priced
    start = datetime.now(UTC) - SPOT_LOOKBACK
    for pool in config.node_pools:
        if "spot" not in pool.capacity_types:
            continue
        pool_zones = [pool.availability_zone] if pool.efa else zones
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=pool.instance_types,
            ProductDescriptions=[SPOT_PRODUCT],
            StartTime=start,
            Filters=[{"Name": "availability-zone", "Values": pool_zones}],
        )
        cheapest: dict[str, tuple[float, str]] = {}
        for page in pages:
            for price in page["SpotPriceHistory"]:
                value, zone = float(price["SpotPrice"]), price["AvailabilityZone"]
                name = price["InstanceType"]
                if zone in pool_zones and (name not in cheapest or value < cheapest[name][0]):
                    cheapest[name] = (value, zone)
        for name in pool.instance_types:
            if name in cheapest:
                value, zone = cheapest[name]
                report.notes.append(
                    f"{pool.name}: {name} spot ${value:.4f}/h in {zone} "
                    f"(on-demand list ${prices.instance(name)}/h in {config.region})"
                )
        if not cheapest:
            line = (
                f"{pool.name}: no spot price for {', '.join(pool.instance_types)} in "
                f"{', '.join(pool_zones)} during the last {SPOT_LOOKBACK.days} day(s)"
            )
            only_spot = pool.capacity_types == ["spot"]
            (report.problems if only_spot else report.warnings).append(line)


def reservation_query(reservation: CapacityReservation) -> dict:
    """DescribeCapacityReservations parameters selecting what Karpenter's selector term selects
    (karpenter-provider-aws at KARPENTER_CHART, capacityreservation/types.go), in any state."""
    if reservation.id:
        return {"CapacityReservationIds": [reservation.id]}
    return {
        "Filters": [
            {"Name": "tag-key", "Values": [key]}
            if value == "*"
            else {"Name": f"tag:{key}", "Values": [value]}
            for key, value in sorted((reservation.tags or {}).items())
        ]
    }


def describe_reservations(ec2, reservation: CapacityReservation) -> list[dict]:
    pages = ec2.get_paginator("describe_capacity_reservations").paginate(
        **reservation_query(reservation)
    )
    try:
        return [r for page in pages for r in page["CapacityReservations"]]
    except ClientError as e:
        # What EC2 answers for an id it does not know (Karpenter's pkg/errors/errors.go).
        if e.response["Error"]["Code"] == "InvalidCapacityReservationId.NotFound":
            return []
        raise


def check_reservations(config: StackConfig, ec2, zones: list[str], report: Report) -> None:
    for pool in config.node_pools:
        pool_zones = [pool.availability_zone] if pool.efa else zones
        for reservation in pool.capacity_reservations:
            check_reservation(pool.name, reservation, ec2, pool_zones, report)


def check_reservation(
    pool: str, reservation: CapacityReservation, ec2, zones: list[str], report: Report
) -> None:
    """ERROR for what Karpenter could not launch into or the plan priced wrongly; WARN for a
    Capacity Block not started yet."""
    selector = reservation.id or "tags " + ", ".join(
        f"{k}={v}" for k, v in sorted((reservation.tags or {}).items())
    )
    found = describe_reservations(ec2, reservation)
    if not found:
        report.problems.append(f"{pool}: capacity reservation {selector} not found")
        return
    wanted = reservation.reservation_type
    for r in found:
        name = r["CapacityReservationId"]
        state, kind = r["State"], r.get("ReservationType", "default")
        dates = f"{_day(r.get('StartDate'))} to {_day(r.get('EndDate'))}"
        expected = {
            "reservationType": (kind, wanted),
            "instance type": (r["InstanceType"], reservation.instance_type),
            "platform": (r["InstancePlatform"], RESERVATION_PLATFORM),
            "tenancy": (r["Tenancy"], RESERVATION_TENANCY),
        }
        wrong = [
            f"{what} {got} (wanted {want})" for what, (got, want) in expected.items() if got != want
        ]
        if r["AvailabilityZone"] not in zones:
            wrong.append(f"zone {r['AvailabilityZone']} (the pool's: {', '.join(zones)})")
        scheduled = state == "scheduled" and kind == "capacity-block"
        if state != "active" and not scheduled:
            wrong.append(f"state {state} (Karpenter launches only into active reservations)")
        if wrong:
            report.problems.append(f"{pool}: {name}: {'; '.join(wrong)}")
        elif scheduled:
            report.warnings.append(
                f"{pool}: {name} scheduled, {dates}: Karpenter launches into it once active"
            )
        else:
            report.notes.append(
                f"{pool}: {name} active, {r['AvailableInstanceCount']} of "
                f"{r['TotalInstanceCount']} x {r['InstanceType']} free in {r['AvailabilityZone']}"
                + (f", {dates}" if kind == "capacity-block" else "")
            )
    total = sum(r["TotalInstanceCount"] for r in found)
    if total != reservation.instance_count:
        report.problems.append(
            f"{pool}: {selector} holds {total} instances, the stack file says "
            f"instanceCount {reservation.instance_count} (what the plan prices)"
        )


def _day(value) -> str:
    return value.date().isoformat() if isinstance(value, datetime) else "?"


def stack_addons(config: StackConfig) -> dict[str, str]:
    """The EKS add-ons the stack installs, at their pinned builds."""
    pinned = KUBERNETES_VERSIONS[config.cluster.kubernetes_version].addons
    skipped = {
        "aws-efs-csi-driver": not config.storage.efs.enabled,
        "aws-fsx-csi-driver": not config.storage.fsx.enabled,
    }
    return {name: build for name, build in pinned.items() if not skipped.get(name)}


def check_addons(config: StackConfig, eks, report: Report) -> None:
    version = config.cluster.kubernetes_version
    pages = eks.get_paginator("describe_addon_versions")
    for name, pinned in sorted(stack_addons(config).items()):
        offered: dict[str, bool] = {}  # build -> EKS's default for this version
        for page in pages.paginate(addonName=name, kubernetesVersion=version):
            for addon in page["addons"]:
                for build in addon["addonVersions"]:
                    offered[build["addonVersion"]] = any(
                        c.get("clusterVersion") == version and c.get("defaultVersion")
                        for c in build.get("compatibilities") or []
                    )
        default = next((b for b, is_default in offered.items() if is_default), None)
        if pinned not in offered:
            report.problems.append(
                f"add-on {name} {pinned} is not offered for Kubernetes {version}"
                + (f" (EKS's default there is {default})" if default else "")
                + "; pin an offered build in infra/core/versions.py"
            )
        elif default and pinned != default:
            report.notes.append(
                f"add-on {name}: pinned {pinned}; EKS's default for Kubernetes {version} is "
                f"{default}"
            )


def check_addon_configuration(config: StackConfig, eks, report: Report) -> None:
    for name, pinned in sorted(stack_addons(config).items()):
        configuration = addon_configuration(name, pinned)
        if not configuration:
            continue
        answer = eks.describe_addon_configuration(addonName=name, addonVersion=pinned)
        schema = json.loads(answer["configurationSchema"])
        for path in key_paths(configuration):
            if schema_lacks(schema, path):
                report.problems.append(
                    f"add-on {name} {pinned} has no configuration key {'.'.join(path)}: "
                    "CreateAddon would refuse the platform's configuration "
                    "(infra/storage/csi_addons.py says what it is for)"
                )


def ami_parameters(config: StackConfig) -> list[str]:
    """The SSM parameters Karpenter reads for the stack's alias (karpenter-provider-aws v1.14.1,
    pkg/providers/amifamily/al2023.go resolvePath): the standard x86_64 AMI, and the NVIDIA one
    for GPU pools."""
    version = config.cluster.kubernetes_version
    release = config.karpenter.ami_alias.split("@", 1)[1]
    variants = ["standard"] + (["nvidia"] if any(p.gpu for p in config.node_pools) else [])
    return [
        f"/aws/service/eks/optimized-ami/{version}/amazon-linux-2023/x86_64/{variant}/"
        f"amazon-eks-node-al2023-x86_64-{variant}-{version}-{release}/image_id"
        for variant in variants
    ]


def check_ami(config: StackConfig, ssm, report: Report) -> None:
    version, alias = config.cluster.kubernetes_version, config.karpenter.ami_alias
    for name in ami_parameters(config):
        try:
            ssm.get_parameter(Name=name)
        except ClientError as e:
            if e.response["Error"]["Code"] != "ParameterNotFound":
                raise
            report.problems.append(
                f"karpenter.amiAlias {alias} has no AMI for Kubernetes {version} ({name} does not "
                "exist): Karpenter would launch no node; pin a release that has one"
            )


def preflight(config: StackConfig, ec2, quotas, eks=None, ssm=None) -> Report:
    """The checks against AWS; the add-ons' and the AMI's only where their clients are given."""
    report = Report()
    zones = stack_zones(config, ec2)
    report.notes.append(f"availability zones: {', '.join(zones)}")
    check_quotas(config, quotas, report)
    check_offerings(config, ec2, zones, report)
    check_spot(config, ec2, zones, report)
    check_reservations(config, ec2, zones, report)
    if eks is not None:
        check_addons(config, eks, report)
        check_addon_configuration(config, eks, report)
    if ssm is not None:
        check_ami(config, ssm, report)
    return report


def aws_clients(region: str):
    session = boto3.Session(region_name=region)
    clients = ("ec2", "service-quotas", "eks", "ssm")
    return tuple(session.client(name) for name in clients)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.preflight",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        config = load_stack_file(args.stack)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    try:
        report = preflight(config, *aws_clients(config.region))
    except (BotoCoreError, ClientError) as e:
        print(f"preflight could not ask AWS ({config.region}): {e}", file=sys.stderr)
        return 2
    print(f"preflight of stack {args.stack} in {config.region}:")
    for line in report.lines():
        print(f"  {line}")
    if report.problems:
        print(f"{len(report.problems)} finding(s) not satisfiable", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
