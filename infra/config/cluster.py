"""`cluster` and `karpenter`: the EKS control plane, its endpoint and system nodes, and the settings
of Karpenter (its AMI release, node repair, the GPU registration watcher)."""

import datetime
import ipaddress
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    model_validator,
)

from infra.config.base import (
    CLUSTER_NAME,
    CpuInstanceType,
    Duration,
    IamPrincipalArn,
    ImageConfig,
    Model,
    hours,
    ipv4_network,
)
from infra.versions import DEFAULT_KUBERNETES_VERSION, KARPENTER_AMI_ALIAS, KUBERNETES_VERSIONS

IAM_ROLE_NAME_MAX = 64


def karpenter_role_names(cluster_name: str) -> dict[str, str]:
    """IAM role names the Karpenter component derives from the cluster name (karpenter.py)."""
    return {
        "node": f"KarpenterNode-{cluster_name}",
        "controller": f"KarpenterController-{cluster_name}",
    }


# Ranges no client on the internet comes from: those Python's ipaddress calls not global
# (`is_global`, after IANA's special-purpose address registry) and multicast, never a source. The
# RFC 5737 documentation ranges are not global either but pass here: Pulumi.prod.yaml ships them
# as placeholders, which `pulumi up` refuses (placeholder_errors). Blocks to lie inside of, not
# IPv4Network.is_global, which judges a network by its first and last address (0.0.0.0/0 is "not
# global" there).
NOT_INTERNET = {
    ipaddress.IPv4Network(cidr): kind
    for cidr, kind in (
        ("0.0.0.0/8", "'this network' range"),
        ("10.0.0.0/8", "private range (RFC 1918)"),
        ("100.64.0.0/10", "carrier-grade NAT range (RFC 6598)"),
        ("127.0.0.0/8", "loopback range"),
        ("169.254.0.0/16", "link-local range"),
        ("172.16.0.0/12", "private range (RFC 1918)"),
        ("192.0.0.0/29", "IETF protocol range"),
        ("192.0.0.170/31", "IETF protocol range"),
        ("192.168.0.0/16", "private range (RFC 1918)"),
        ("198.18.0.0/15", "benchmarking range (RFC 2544)"),
        ("224.0.0.0/4", "multicast range"),
        ("240.0.0.0/4", "reserved range"),
    )
}


def _internet_range(network: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    """A source the EKS public endpoint can see: not wholly inside a NOT_INTERNET range (a range
    that holds internet addresses, as 0.0.0.0/0 does, passes)."""
    kind = next((k for n, k in NOT_INTERNET.items() if network.subnet_of(n)), None)
    if kind:
        raise ValueError(
            f"{network} is not an internet range but a {kind}: no client of the public endpoint "
            "has such an address; allowed: public addresses your admins come from, e.g. an "
            "office's /24 (from a private network into the VPC, privateAccess serves instead)"
        )
    return network


InternetCidr = Annotated[Any, AfterValidator(ipv4_network), AfterValidator(_internet_range)]


class EndpointAccess(Model):
    public_access: bool = True
    private_access: bool = True
    public_access_cidrs: list[InternetCidr] = Field(
        default=["0.0.0.0/0"], min_length=1, validate_default=True
    )

    @model_validator(mode="after")
    def _reachable(self) -> "EndpointAccess":
        if not (self.public_access or self.private_access):
            raise ValueError(
                "publicAccess and privateAccess are both false; allowed: at least one true"
            )
        return self


class NodeGroupConfig(Model):
    instance_type: CpuInstanceType = "m6i.large"
    min_size: int = Field(default=2, ge=1, le=20)
    desired_size: int = Field(default=2, ge=1, le=20)
    max_size: int = Field(default=3, ge=1, le=20)
    disk_size_gib: int = Field(default=50, ge=20, le=1000)

    @model_validator(mode="after")
    def _ordered(self) -> "NodeGroupConfig":
        if not self.min_size <= self.desired_size <= self.max_size:
            raise ValueError(
                f"sizes min={self.min_size} desired={self.desired_size} max={self.max_size}; "
                "allowed: minSize <= desiredSize <= maxSize"
            )
        return self


# The retention periods CloudWatch Logs accepts (PutRetentionPolicy, retentionInDays).
LogRetentionDays = Literal[
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
]


class ClusterConfig(Model):
    # Lowercase words joined by single hyphens: the ECR repository `<name>/trainer` allows
    # nothing else (no uppercase, no `--`, no trailing `-`).
    name: str = Field(default="training-platform", pattern=CLUSTER_NAME, max_length=100)
    kubernetes_version: Literal[tuple(KUBERNETES_VERSIONS)] = (  # type: ignore[valid-type]
        DEFAULT_KUBERNETES_VERSION
    )
    # What EKS does when the version leaves standard support (EKS upgrade policy): EXTENDED (EKS's
    # API default) keeps the version and bills extended support from that day; STANDARD has EKS
    # upgrade the control plane to the next version that day, ahead of this stack's add-ons,
    # nodes and state (the next `pulumi up` must then name the new version). The plan shows the
    # date and what each choice costs.
    upgrade_policy: Literal["EXTENDED", "STANDARD"] = "EXTENDED"
    endpoint: EndpointAccess = EndpointAccess()
    # IAM principals given cluster-admin through EKS access entries.
    admin_principal_arns: list[IamPrincipalArn] = Field(default_factory=list)
    system_node_group: NodeGroupConfig = NodeGroupConfig()
    # How long CloudWatch keeps the control plane's logs (all five types, audit included); EKS
    # would otherwise create the log group itself and keep them forever, billed per GB-month.
    log_retention_days: LogRetentionDays = 90
    deletion_protection: bool = False

    @model_validator(mode="after")
    def _derived_names_legal(self) -> "ClusterConfig":
        arns = self.admin_principal_arns
        repeated = sorted({a for a in arns if arns.count(a) > 1})
        if repeated:
            raise ValueError(
                f"adminPrincipalArns repeats {', '.join(repeated)}; allowed: each ARN once"
            )
        for what, role in karpenter_role_names(self.name).items():
            if len(role) > IAM_ROLE_NAME_MAX:
                longest = IAM_ROLE_NAME_MAX - len(role) + len(self.name)
                raise ValueError(
                    f"name {self.name!r} makes the Karpenter {what} IAM role name {role!r} "
                    f"{len(role)} characters long; allowed: a name of at most {longest} "
                    f"characters (IAM role names stop at {IAM_ROLE_NAME_MAX})"
                )
        return self


def utc_today() -> datetime.date:
    return datetime.datetime.now(datetime.UTC).date()


def _ami_release_day(alias: str) -> str:
    """An AL2023 release is named after the day it was built: a real day, and not later than
    tomorrow in UTC (its builder's time zone may be ahead of UTC)."""
    digits = alias.removeprefix("al2023@v")
    try:
        day = datetime.date(int(digits[:4]), int(digits[4:6]), int(digits[6:]))
    except ValueError:
        raise ValueError(
            f"{alias} is not a calendar date; allowed: al2023@vYYYYMMDD, the day of an EKS AMI "
            f"release, e.g. {KARPENTER_AMI_ALIAS}"
        ) from None
    tomorrow = utc_today() + datetime.timedelta(days=1)
    if day > tomorrow:
        raise ValueError(
            f"{alias} is dated {day}, after tomorrow ({tomorrow}, UTC): no such release exists "
            f"yet; allowed: a released version, e.g. {KARPENTER_AMI_ALIAS}"
        )
    return alias


def _gpu_registration_timeout(value: str) -> str:
    if not 1 / 60 <= hours(value) <= 24:
        raise ValueError(
            f"{value} is out of range; allowed: 1m to 24h (a GPU node's device plugin needs "
            "minutes to register)"
        )
    return value


class KarpenterConfig(Model):
    # Pinned AL2023 release (al2023@vYYYYMMDD): `@latest` would silently roll every node.
    ami_alias: Annotated[str, AfterValidator(_ami_release_day)] = Field(
        default=KARPENTER_AMI_ALIAS, pattern=r"^al2023@v\d{8}$"
    )
    # Karpenter's NodeRepair feature gate (alpha, off upstream): replace a node whose Ready or
    # node monitoring agent condition stays bad (README, "Node health and repair").
    node_repair: bool = True
    # How long a GPU node may go without allocatable nvidia.com/gpu after it joined before the
    # watcher deletes its NodeClaim. Default: the slowest GPU pool's modelled launch with margin
    # (infra/components/gpu_registration_watch.py, registration_timeout).
    gpu_registration_timeout: (
        Annotated[Duration, AfterValidator(_gpu_registration_timeout)] | None
    ) = None
    # NodeClaims the watcher deletes in one run at most (a broken AMI must not empty a pool at
    # once); 0: it only records events.
    gpu_registration_max_deletions: int = Field(default=1, ge=0, le=10)
    # A prebuilt watcher image by digest; empty: build gpuwatch/Dockerfile and push it to ECR.
    gpu_registration_watch_image: ImageConfig = ImageConfig()

    @property
    def gpu_registration_timeout_seconds(self) -> int | None:
        """gpuRegistrationTimeout in seconds; None when it is left to its default."""
        timeout = self.gpu_registration_timeout
        return round(hours(timeout) * 3600) if timeout else None
