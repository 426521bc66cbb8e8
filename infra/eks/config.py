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

from infra.core.config import (
    CLUSTER_NAME,
    CpuInstanceType,
    Duration,
    IamPrincipalArn,
    ImageConfig,
    Model,
    hours,
    ipv4_network,
)
from infra.core.versions import DEFAULT_KUBERNETES_VERSION, KARPENTER_AMI_ALIAS, KUBERNETES_VERSIONS

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
    """Who reaches the EKS API server: from the internet (listed ranges), from the VPC, or both."""

    public_access: bool = Field(default=True, description="The API endpoint is on the internet.")
    private_access: bool = Field(
        default=True, description="The API endpoint is reachable from inside the VPC."
    )
    public_access_cidrs: list[InternetCidr] = Field(
        default=["0.0.0.0/0"],
        min_length=1,
        # EKS service quotas: "Public endpoint access CIDR ranges per cluster", 40, not
        # adjustable (EKS user guide, service-quotas).
        max_length=40,
        validate_default=True,
        description="Internet ranges the public endpoint admits, at most 40 (EKS's fixed quota): "
        "ranges no internet client can "
        "come from (private, CGNAT, loopback, link-local, reserved, multicast) are refused. A "
        "production stack's endpoint open to the world is the eks-endpoint-not-public-in-"
        "production policy's to refuse.",
    )

    @model_validator(mode="after")
    def _reachable(self) -> "EndpointAccess":
        if not (self.public_access or self.private_access):
            raise ValueError(
                "publicAccess and privateAccess are both false; allowed: at least one true"
            )
        return self


class NodeGroupConfig(Model):
    """The managed node group of the controllers (tainted CriticalAddonsOnly; on-demand CPU)."""

    instance_type: CpuInstanceType = Field(
        default="m6i.large", description="A CPU instance type of the catalog."
    )
    min_size: int = Field(default=2, ge=1, le=20, description="Fewest nodes (minSize <= desired).")
    desired_size: int = Field(default=2, ge=1, le=20, description="Nodes to start with.")
    max_size: int = Field(
        default=3, ge=1, le=20, description="Most nodes; the plan prices the group at this."
    )
    disk_size_gib: int = Field(
        default=50, ge=20, le=1000, description="Encrypted gp3 root volume per node, GiB."
    )

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
    """The EKS control plane: name, version, API endpoint, admins and the system node group."""

    name: str = Field(
        default="training-platform",
        pattern=CLUSTER_NAME,
        max_length=100,
        description="The EKS cluster's name: lowercase words joined by single hyphens (the ECR "
        "repository <name>/trainer allows nothing else), short enough that every IAM role name "
        "derived from it stays within 64 characters (at most 44 characters). Changing it "
        "replaces the cluster (acknowledgeDataLoss: cluster, images).",
    )
    kubernetes_version: Literal[tuple(KUBERNETES_VERSIONS)] = Field(  # type: ignore[valid-type]
        default=DEFAULT_KUBERNETES_VERSION,
        description="A Kubernetes version of infra/core/versions.py KUBERNETES_VERSIONS (its "
        "add-ons "
        "pinned there); one minor version up at a time (docs: day two, upgrades).",
    )
    upgrade_policy: Literal["EXTENDED", "STANDARD"] = Field(
        default="EXTENDED",
        description="What EKS does when the version leaves standard support: EXTENDED (EKS's API "
        "default) keeps it and bills extended support from that day; STANDARD has EKS upgrade "
        "the control plane that day, ahead of this stack's add-ons, nodes and state. The plan "
        "shows the date and what each choice costs.",
    )
    endpoint: EndpointAccess = Field(
        default=EndpointAccess(), description="Who reaches the EKS API server."
    )
    admin_principal_arns: list[IamPrincipalArn] = Field(
        default_factory=list,
        description="IAM roles or users given cluster-admin through EKS access entries, each "
        "once. Set your own in every stack: the kubeconfig authenticates as your AWS identity. "
        "An ARN of one of AWS's documentation accounts (123456789012, 111122223333, ...) is a "
        "placeholder pulumi up refuses.",
    )
    system_node_group: NodeGroupConfig = Field(
        default=NodeGroupConfig(), description="The controllers' managed node group."
    )
    log_retention_days: LogRetentionDays = Field(
        default=90,
        description="How long CloudWatch keeps the control plane's logs (all five types, audit "
        "included); EKS would otherwise create the log group itself and keep them forever.",
    )
    deletion_protection: bool = Field(
        default=False,
        description="EKS deletion protection: set it false and pulumi up before pulumi destroy.",
    )

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
    """Karpenter's node image, node repair, and the GPU registration watcher."""

    ami_alias: Annotated[str, AfterValidator(_ami_release_day)] = Field(
        default=KARPENTER_AMI_ALIAS,
        pattern=r"^al2023@v\d{8}$",
        description="The pinned AL2023 release of Karpenter's nodes, al2023@vYYYYMMDD: a real "
        "day, not after tomorrow (UTC), not before the first AL2023 release for the cluster's "
        "Kubernetes version. `@latest` would silently roll every node.",
    )
    node_repair: bool = Field(
        default=True,
        description="Karpenter's NodeRepair feature gate (alpha, off upstream): replace a node "
        "whose Ready or node monitoring agent condition stays bad. False keeps faulty nodes for "
        "investigation.",
    )
    gpu_registration_timeout: (
        Annotated[Duration, AfterValidator(_gpu_registration_timeout)] | None
    ) = Field(
        default=None,
        description="How long a GPU node may lack allocatable nvidia.com/gpu after it was "
        "created before the watcher deletes its NodeClaim, 1m to 24h. Default: the slowest GPU "
        "pool's modelled launch x 1.5, in whole minutes (dev: 9m).",
    )
    gpu_registration_max_deletions: int = Field(
        default=1,
        ge=0,
        le=10,
        description="NodeClaims the watcher deletes in one run (every 5 minutes) at most, so a "
        "broken AMI cannot empty a pool at once; 0: it only records events.",
    )
    gpu_registration_watch_image: ImageConfig = Field(
        default=ImageConfig(),
        description="The watcher's image by digest; empty: built from gpuwatch/Dockerfile and "
        "pushed to ECR by pulumi up.",
    )

    @property
    def gpu_registration_timeout_seconds(self) -> int | None:
        """gpuRegistrationTimeout in seconds; None when it is left to its default."""
        timeout = self.gpu_registration_timeout
        return round(hours(timeout) * 3600) if timeout else None
