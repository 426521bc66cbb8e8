"""Typed stack config: the `training-platform:` namespace of `Pulumi.<stack>.yaml`, validated once.

Every key is camelCase in YAML, as Pulumi config is written. A bad value stops the program with a
single ConfigError that names each offending key path and what is allowed there.
"""

import datetime
import difflib
import ipaddress
import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

import pulumi
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from infra.catalog import (
    InstanceType,
    UnpricedError,
    load_catalog,
    load_prices,
    load_published_busbw,
)
from infra.paths import PROJECT_DIR
from infra.regions import AWS_REGIONS
from infra.versions import AL2023_FIRST_RELEASE, EKS_ADDONS, KARPENTER_AMI_ALIAS
from trainer.options import OptionsError, parse_options

NAMESPACE = "training-platform"
# S3 prefix of job checkpoints in the training bucket (each job writes under its own subprefix).
CHECKPOINT_PREFIX = "checkpoints/"
# What a job or DevServer flavor names as its nodePool to run on the hybrid machines: their
# nodes' pool label and their Kueue flavor. No NodePool may take the name.
HYBRID_POOL = "hybrid"
# Stacks whose mandatory guards no stack file can switch off: `policy.productionStacks` may add
# stacks to this list, never drop one.
MANDATORY_PRODUCTION_STACKS = ("prod",)
# Namespaces the cluster or this program's controllers own: a team namespace there would mix
# job pods (and their Pod Identity roles) with system components.
SYSTEM_NAMESPACES = (
    "default",
    "kube-node-lease",
    "kube-public",
    "kube-system",
    "kubeflow",
    "kueue-system",
    "monitoring",
    "mpi-operator",
    "local-path-storage",
)
IAM_ROLE_NAME_MAX = 64
# Pulumi auto-names a resource `<logical name>-<7 random hex>`.
AUTONAME_SUFFIX = 8
# Bounds of a node's lifetime (expireAfter): under an hour nodes churn under running jobs; over
# 90 days they miss the AMI patches that only replacement brings.
EXPIRE_AFTER_HOURS = (1, 2160)


class ConfigError(pulumi.RunError):
    """Invalid stack config. A RunError, so `pulumi up` prints the message without a traceback."""


class Model(BaseModel):
    # strict: `minSize: true` or `maxNodes: "4"` is an error, not 1 or 4.
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        frozen=True,
        hide_input_in_errors=True,
        strict=True,
    )


def karpenter_role_names(cluster_name: str) -> dict[str, str]:
    """IAM role names the Karpenter component derives from the cluster name (karpenter.py)."""
    return {
        "node": f"KarpenterNode-{cluster_name}",
        "controller": f"KarpenterController-{cluster_name}",
    }


def job_role_resource_name(job_name: str) -> str:
    """Logical name of a job's Pod Identity role; Pulumi auto-names the IAM role from it."""
    return f"job-{job_name}-pods"


def _allowed(values: list[str] | tuple[str, ...], none: str) -> str:
    """`allowed: a, b` or, with nothing to offer, what to do instead."""
    return f"allowed: {', '.join(values)}" if values else none


def _did_you_mean(value: str, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(value, list(choices), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def _not_a_pool(name: str, config: "StackConfig") -> str:
    """The message for a reference (a job's, a flavor's) to a pool that does not exist."""
    pools = [p.name for p in config.node_pools]
    if name == HYBRID_POOL:
        return (
            f"{HYBRID_POOL} names the hybrid machines but the stack has no hybrid section; "
            + _allowed(pools, "allowed: none yet")
            + ", or add a training-platform:hybrid section"
        )
    pools += [HYBRID_POOL] if config.hybrid else []
    return (
        f"{name!r} is not a node pool; "
        + _did_you_mean(name, pools)
        + _allowed(pools, "allowed: none yet, declare nodePools first")
    )


def _known_region(value: str) -> str:
    if value not in AWS_REGIONS:
        raise ValueError(
            f"{value!r} is not a known AWS region; {_did_you_mean(value, AWS_REGIONS)}"
            f"allowed: a region in infra/regions.py, e.g. us-west-2"
        )
    return value


def _hours(duration: str) -> float:
    units = {"s": 1 / 3600, "m": 1 / 60, "h": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"([0-9]+)([smh])", duration))


def _ipv4_network(value: Any) -> ipaddress.IPv4Network:
    if not isinstance(value, str):
        raise ValueError("must be a string such as 10.0.0.0/16")
    try:
        network = ipaddress.IPv4Network(value, strict=True)
    except ValueError:
        raise ValueError(
            f"{value!r} is not an IPv4 CIDR; allowed: a network address with prefix, "
            "such as 10.0.0.0/16 (host bits zero)"
        ) from None
    return network


def _vpc_range(network: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    """AWS refuses VPC ranges that are loopback, link-local, multicast or otherwise reserved."""
    reserved = {
        "loopback": network.is_loopback,
        "link-local": network.is_link_local,
        "multicast": network.is_multicast,
        "reserved": network.is_reserved or network.overlaps(ipaddress.IPv4Network("0.0.0.0/8")),
    }
    bad = [kind for kind, hit in reserved.items() if hit]
    if bad:
        raise ValueError(
            f"{network} is a {bad[0]} range; allowed: a private range such as 10.0.0.0/16, "
            "172.16.0.0/16 or 192.168.0.0/16"
        )
    return network


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


Cidr = Annotated[Any, AfterValidator(_ipv4_network)]
InternetCidr = Annotated[Any, AfterValidator(_ipv4_network), AfterValidator(_internet_range)]


def _known_instance_type(gpu: bool | None):
    def check(name: str) -> str:
        allowed = load_catalog().names(gpu=gpu)
        if name not in allowed:
            kind = {True: "GPU", False: "CPU", None: "known"}[gpu]
            raise ValueError(
                f"{name!r} is not a {kind} instance type in infra/catalog/instance_types.yaml; "
                f"allowed: {', '.join(allowed)}"
            )
        return name

    return AfterValidator(check)


CpuInstanceType = Annotated[str, _known_instance_type(gpu=False)]
InstanceTypeName = Annotated[str, _known_instance_type(gpu=None)]
K8S_NAME = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"
CLUSTER_NAME = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"
PATTERN_HINTS = {
    K8S_NAME: "lowercase letters, digits and '-', 1 to 40 characters, alphanumeric at both ends",
    CLUSTER_NAME: "lowercase words joined by single hyphens, e.g. tp-dev (the ECR repository "
    "<name>/trainer allows no uppercase, '--' or trailing '-')",
}
K8sName = Annotated[str, Field(pattern=K8S_NAME)]
Duration = Annotated[str, Field(pattern=r"^([0-9]{1,7}[smh]){1,3}$")]
VpcId = Annotated[str, Field(pattern=r"^vpc-[0-9a-f]{8,17}$")]
SubnetId = Annotated[str, Field(pattern=r"^subnet-[0-9a-f]{8,17}$")]
IAM_PRINCIPAL_ARN = r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$"
PATTERN_HINTS[IAM_PRINCIPAL_ARN] = (
    "an IAM role or user ARN, e.g. arn:aws:iam::123456789012:role/platform-admins"
)
IamPrincipalArn = Annotated[str, Field(pattern=IAM_PRINCIPAL_ARN)]


class ExistingVpc(Model):
    """Adopt a VPC someone else owns: the program tags its subnets but creates none."""

    vpc_id: VpcId
    private_subnet_ids: list[SubnetId] = Field(min_length=2, max_length=6)
    public_subnet_ids: list[SubnetId] = Field(default_factory=list, max_length=6)

    @model_validator(mode="after")
    def _distinct(self) -> "ExistingVpc":
        every = self.private_subnet_ids + self.public_subnet_ids
        repeated = sorted({s for s in every if every.count(s) > 1})
        if repeated:
            raise ValueError(
                f"subnets {', '.join(repeated)} are listed more than once; allowed: each subnet "
                "once, in privateSubnetIds or publicSubnetIds"
            )
        return self


# VPC endpoints a stack may create: `s3` is a gateway endpoint (no hourly charge), the others
# interface endpoints, one network interface per AZ (billed per AZ-hour).
GATEWAY_ENDPOINTS = ("s3",)
VpcEndpoint = Literal[
    "s3",
    "ec2",
    "ecr.api",
    "ecr.dkr",
    "eks",
    "eks-auth",
    "elasticfilesystem",
    "sqs",
    "ssm",
    "sts",
]


class NetworkConfig(Model):
    cidr: Cidr = Field(default="10.0.0.0/16", validate_default=True)
    az_count: int = Field(default=2, ge=2, le=3)
    nat_gateways: Literal["single", "perAz"] = "single"
    # Explicit subnet CIDRs, one per AZ; by default they are carved from `cidr`.
    private_subnet_cidrs: list[Cidr] | None = Field(default=None, min_length=1)
    public_subnet_cidrs: list[Cidr] | None = Field(default=None, min_length=1)
    existing_vpc: ExistingVpc | None = None
    vpc_endpoints: list[VpcEndpoint] = Field(default_factory=list)

    @model_validator(mode="after")
    def _endpoints(self) -> "NetworkConfig":
        repeated = sorted({e for e in self.vpc_endpoints if self.vpc_endpoints.count(e) > 1})
        if repeated:
            raise ValueError(
                f"vpcEndpoints lists {', '.join(repeated)} more than once; allowed: each once"
            )
        if self.vpc_endpoints and self.existing_vpc:
            raise ValueError(
                "vpcEndpoints is set with existingVpc; allowed: no vpcEndpoints in an adopted "
                "VPC (its owner keeps its routes and endpoints)"
            )
        return self

    def interface_endpoints(self) -> list[str]:
        return [e for e in self.vpc_endpoints if e not in GATEWAY_ENDPOINTS]

    @model_validator(mode="after")
    def _subnets_fit(self) -> "NetworkConfig":
        _vpc_range(self.cidr)
        if not 16 <= self.cidr.prefixlen <= 20:
            raise ValueError(
                f"cidr {self.cidr} has prefix /{self.cidr.prefixlen}; allowed: /16 to /20 "
                "(pods take VPC addresses, small VPCs run out)"
            )
        private, public = self.subnet_cidrs()
        for key, subnets in (("privateSubnetCidrs", private), ("publicSubnetCidrs", public)):
            if len(subnets) != self.az_count:
                raise ValueError(
                    f"{key} has {len(subnets)} entries; allowed: one per AZ ({self.az_count})"
                )
            for subnet in subnets:
                if not subnet.subnet_of(self.cidr):
                    raise ValueError(f"{key}: {subnet} lies outside the VPC cidr {self.cidr}")
        every = private + public
        for i, a in enumerate(every):
            for b in every[i + 1 :]:
                if a.overlaps(b):
                    raise ValueError(f"subnets {a} and {b} overlap; allowed: disjoint subnets")
        return self

    def subnet_cidrs(self) -> tuple[list[ipaddress.IPv4Network], list[ipaddress.IPv4Network]]:
        """(private, public) CIDRs per AZ: explicit ones from config, else carved from `cidr`.

        The VPC splits into eight blocks: the first az_count are private (nodes and pods need
        most addresses), the last is cut into /24-or-smaller public subnets for NAT and LBs.
        """
        eighths = list(self.cidr.subnets(prefixlen_diff=3))
        public_prefix = max(eighths[-1].prefixlen + 2, 24)
        carved_public = list(eighths[-1].subnets(new_prefix=public_prefix))
        private = self.private_subnet_cidrs or eighths[: self.az_count]
        public = self.public_subnet_cidrs or carved_public[: self.az_count]
        return list(private), list(public)


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


class ClusterConfig(Model):
    # Lowercase words joined by single hyphens: the ECR repository `<name>/trainer` allows
    # nothing else (no uppercase, no `--`, no trailing `-`).
    name: str = Field(default="training-platform", pattern=CLUSTER_NAME, max_length=100)
    kubernetes_version: Literal[tuple(EKS_ADDONS)] = next(iter(EKS_ADDONS))  # type: ignore[valid-type]
    endpoint: EndpointAccess = EndpointAccess()
    # IAM principals given cluster-admin through EKS access entries.
    admin_principal_arns: list[IamPrincipalArn] = Field(default_factory=list)
    system_node_group: NodeGroupConfig = NodeGroupConfig()
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


def pod_room(node: "InstanceType | HybridMachine") -> tuple[int, int]:
    """(vCPU, GiB of memory) a pod may request and still fit alone on this node.

    What the node keeps: EC2's memory overhead (Karpenter assumes 7.5 %), the kubelet's
    reservations and eviction threshold, and the DaemonSets (CNI, kube-proxy, CSI and device
    plugins, GPU metrics): 10 % of the vCPUs (at least one) and 15 % of the memory.
    """
    vcpu, memory_gib = node.vcpu, node.memory_gib
    return min(vcpu - 1, math.floor(vcpu * 0.9)), math.floor(memory_gib * 0.85)


def smallest_room(nodes: "list[InstanceType] | list[HybridMachine]") -> tuple[int, int]:
    """(vCPU, GiB) a pod may request and fit alone on any of `nodes` (pod_room of each)."""
    rooms = [pod_room(n) for n in nodes]
    return min(vcpu for vcpu, _ in rooms), min(memory for _, memory in rooms)


# gp3 root volume throughput (MiB/s) by whether the pool's nodes have NVMe instance store. Without
# it, images unpack onto the root volume: nodeadm's FastImagePull guide asks for at least 600 MiB/s
# (awslabs/amazon-eks-ami nodeadm/doc/examples.md, "Enabling fast image pull"); gp3's baseline 125
# MiB/s would make the disk the bottleneck of every cold start. With it, the root volume holds only
# the OS and gets gp3's baseline, which costs nothing extra.
ROOT_THROUGHPUT_MIBPS = {False: 600, True: 125}


class PoolCeiling(BaseModel):
    """The most a NodePool can ever hold; Karpenter limits and Kueue quotas both come from it."""

    nodes: int
    gpus: int
    vcpu: int
    memory_gib: int


class CapacityReservation(Model):
    """EC2 capacity bought ahead that a pool launches into first (Karpenter's `reserved` capacity
    type): an On-Demand Capacity Reservation (`default`) or a Capacity Block for ML
    (`capacity-block`), selected by id or by tags. Type and count are what the plan prices and
    infra.preflight checks against AWS."""

    id: str | None = Field(default=None, pattern=r"^cr-[0-9a-z]+$")
    # Every reservation carrying all these tags; "*" matches any value (Karpenter's semantics).
    tags: dict[str, str] | None = Field(default=None, min_length=1, max_length=20)
    reservation_type: Literal["default", "capacity-block"] = "default"
    instance_type: InstanceTypeName
    instance_count: int = Field(ge=1, le=1000)

    @model_validator(mode="after")
    def _one_selector(self) -> "CapacityReservation":
        if (self.id is None) == (self.tags is None):
            raise ValueError(
                "needs id or tags, not both and not neither; allowed: id: cr-... (one "
                "reservation) or tags: {key: value} (every reservation carrying them)"
            )
        if self.tags and any(key == "" or value == "" for key, value in self.tags.items()):
            raise ValueError(
                "tags has an empty key or value, which Karpenter's EC2NodeClass refuses; "
                "allowed: non-empty keys and values ('*' for any value)"
            )
        return self

    def selector_term(self) -> dict:
        """The EC2NodeClass capacityReservationSelectorTerms entry that selects it."""
        return {"id": self.id} if self.id else {"tags": dict(self.tags or {})}


# all_reduce_perf's message sizes: from 8 bytes, doubling (`-b 8 -f 2`), up to the check's maxBytes.
FABRIC_MIN_BYTES = 8
# What the check sweeps up to when neither maxBytes nor a floor says more: busbw has left the
# latency-bound small sizes well behind by 1 GiB on every published run.
FABRIC_DEFAULT_MAX_BYTES = 1 << 30
# all_reduce_perf allocates three buffers of maxBytes per GPU (send, receive, expected).
FABRIC_MAX_BYTES = 1 << 34
# A default floor is this share of the published figure: nccl-tests' own bandwidth check fails a
# run whose average busbw is below 0.9 times the figure given in NCCL_TESTS_MIN_BW
# (NVIDIA/nccl-tests src/util.cu writeResultFooter, src/common.cu run()).
PUBLISHED_FLOOR_SHARE = 0.9


def fabric_sizes(max_bytes: int) -> list[int]:
    """The message sizes all_reduce_perf -b 8 -e max_bytes -f 2 runs."""
    sizes, size = [], FABRIC_MIN_BYTES
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


class BusbwFloor(Model):
    """The least busbw (GB/s, as all_reduce_perf prints it) every size from fromBytes to toBytes
    (inclusive; no toBytes: the largest size run) must reach, out-of-place and in-place."""

    from_bytes: int = Field(ge=FABRIC_MIN_BYTES, le=FABRIC_MAX_BYTES)
    to_bytes: int | None = Field(default=None, ge=FABRIC_MIN_BYTES, le=FABRIC_MAX_BYTES)
    min_busbw: float = Field(gt=0, le=10000, allow_inf_nan=False)

    @model_validator(mode="after")
    def _ordered(self) -> "BusbwFloor":
        if self.to_bytes is not None and self.to_bytes < self.from_bytes:
            raise ValueError(
                f"toBytes {self.to_bytes} < fromBytes {self.from_bytes}; allowed: "
                "fromBytes <= toBytes"
            )
        return self

    def covers(self, size: int) -> bool:
        return self.from_bytes <= size and (self.to_bytes is None or size <= self.to_bytes)


class FabricCheckConfig(Model):
    """The pool's NCCL fabric check (python -m workloads.nccl_check): all_reduce_perf on every GPU
    of `nodes` nodes, each size's busbw held to `floors`."""

    nodes: int = Field(default=2, ge=2, le=1000)
    # all_reduce_perf -e; default: the largest size a floor names, else 1 GiB.
    max_bytes: int | None = Field(default=None, ge=FABRIC_MIN_BYTES, le=FABRIC_MAX_BYTES)
    # None: the published default for the pool's instance family (infra/catalog/nccl_busbw.yaml);
    # []: no floor (the check reports busbw and judges only the network and #wrong).
    floors: list[BusbwFloor] | None = None


@dataclass(frozen=True)
class FabricCheckPlan:
    """A pool's fabric check as it runs: nodes, sizes, floors and where the floors came from."""

    nodes: int
    max_bytes: int
    floors: tuple[BusbwFloor, ...]
    basis: str  # one line for the report: stack config, a published figure, or why there is none

    @property
    def sizes(self) -> list[int]:
        return fabric_sizes(self.max_bytes)


class NodePoolConfig(Model):
    """A Karpenter NodePool. GPU or CPU follows from its instance types, which may not mix."""

    hybrid: ClassVar[bool] = False  # what the jobs and flavors on it read (HybridPool: True)

    name: K8sName
    instance_types: list[InstanceTypeName] = Field(min_length=1)
    max_nodes: int = Field(ge=1, le=1000)
    capacity_types: list[Literal["on-demand", "spot", "reserved"]] = Field(
        default=["on-demand"], min_length=1
    )
    # Karpenter's EC2NodeClass takes at most 30 selector terms.
    capacity_reservations: list[CapacityReservation] = Field(default_factory=list, max_length=30)
    # Karpenter keeps maxNodes nodes running (a static NodePool, `replicas`), whether or not a job
    # runs; Kueue's topology-aware scheduling needs nodes that exist (see topology).
    static_nodes: bool = False
    efa: bool = False
    # EFA pools keep their nodes in one AZ and one cluster placement group: required there, as an
    # instance type is not offered in every AZ (infra.preflight checks it is in this one).
    availability_zone: str | None = Field(default=None, pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$")
    disk_size_gib: int = Field(default=200, ge=50, le=16000)
    # gp3 throughput of the root volume in MiB/s; Karpenter's EC2NodeClass takes 125 to 1000.
    # Default: ROOT_THROUGHPUT_MIBPS by whether image pulls land on it (see root_throughput_mibps).
    disk_throughput_mibps: int | None = Field(default=None, ge=125, le=1000)
    expire_after: Duration = "720h"
    fabric_check: FabricCheckConfig = FabricCheckConfig()

    @model_validator(mode="after")
    def _fabric_check_fits(self) -> "NodePoolConfig":
        check = self.fabric_check
        if "fabric_check" in self.model_fields_set and not self.gpu:
            raise ValueError(
                "fabricCheck is set on a CPU pool; allowed: only on GPU pools (it runs NCCL)"
            )
        # The default (2) only matters when the check runs; the CLI refuses a pool too small.
        if "nodes" in check.model_fields_set and check.nodes > self.max_nodes:
            raise ValueError(
                f"fabricCheck.nodes {check.nodes} exceeds maxNodes {self.max_nodes}; allowed: "
                f"2 to {self.max_nodes}"
            )
        sizes = fabric_sizes(self.fabric_check_plan().max_bytes)
        for i, floor in enumerate(check.floors or []):
            if not any(floor.covers(size) for size in sizes):
                raise ValueError(
                    f"fabricCheck.floors[{i}] covers no size the check runs (8 B doubling up to "
                    f"{sizes[-1]} B); allowed: a range holding one of them, or a larger maxBytes"
                )
        return self

    @model_validator(mode="after")
    def _consistent(self) -> "NodePoolConfig":
        low, high = EXPIRE_AFTER_HOURS
        if not low <= _hours(self.expire_after) <= high:
            raise ValueError(
                f"expireAfter {self.expire_after} is {_hours(self.expire_after):g} hours; allowed: "
                f"{low}h to {high}h (nodes must be replaced to pick up patched AMIs)"
            )
        if len(set(self.capacity_types)) != len(self.capacity_types):
            raise ValueError(
                "capacityTypes repeats a value; allowed: on-demand, spot and/or reserved, once each"
            )
        self._reservations_fit()
        if len({t.gpus > 0 for t in self.types}) > 1:
            raise ValueError("instanceTypes mixes GPU and CPU types; allowed: all GPU or all CPU")
        without_efa = [t.name for t in self.types if not t.efa]
        if self.availability_zone and not self.efa:
            raise ValueError("availabilityZone is set but efa is false; allowed: only on EFA pools")
        if self.efa and without_efa:
            raise ValueError(
                f"efa is true but {', '.join(without_efa)} has no EFA; allowed with efa: "
                + ", ".join(t for t in load_catalog().names(gpu=True) if load_catalog()[t].efa)
            )
        return self

    def _reservations_fit(self) -> None:
        reserved = self.reserved_count
        if ("reserved" in self.capacity_types) != bool(self.capacity_reservations):
            raise ValueError(
                (
                    "capacityTypes lists reserved without capacityReservations (Karpenter would "
                    "find no reserved capacity)"
                    if reserved == 0
                    else "capacityReservations is set but capacityTypes lacks reserved "
                    "(Karpenter would never launch into them)"
                )
                + "; allowed: capacityReservations together with reserved in capacityTypes"
            )
        for i, reservation in enumerate(self.capacity_reservations):
            if reservation.instance_type not in self.instance_types:
                raise ValueError(
                    f"capacityReservations[{i}].instanceType {reservation.instance_type} is not "
                    f"one of the pool's instanceTypes; allowed: {', '.join(self.instance_types)}"
                )
        ids = [r.id for r in self.capacity_reservations if r.id]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(
                f"capacityReservations lists {', '.join(repeated)} more than once; allowed: "
                "each reservation once"
            )
        if reserved > self.max_nodes:
            raise ValueError(
                f"capacityReservations hold {reserved} instances but maxNodes is "
                f"{self.max_nodes}: Karpenter's limits would leave reservations you pay for "
                f"unused; allowed: maxNodes of at least {reserved}"
            )
        if self.capacity_types == ["reserved"] and reserved != self.max_nodes:
            raise ValueError(
                f"capacityTypes is only reserved, whose {reserved} instances are all Karpenter "
                f"can launch, but maxNodes is {self.max_nodes}: Kueue would admit jobs no node "
                f"can run; allowed: maxNodes {reserved}, or on-demand/spot beside reserved"
            )

    @property
    def reserved_count(self) -> int:
        """Instances the pool's reservations hold: billed whether or not the pool uses them."""
        return sum(r.instance_count for r in self.capacity_reservations)

    @property
    def topology(self) -> bool:
        """Kueue places this pool's jobs by network topology: its nodes exist (static) and carry
        EC2's topology labels. Kueue computes free capacity from existing nodes only, and
        Karpenter creates nodes only for pending pods: on a dynamic pool nothing would start."""
        return self.static_nodes and all(t.network_topology for t in self.types)

    @property
    def types(self) -> list[InstanceType]:
        return [load_catalog()[name] for name in self.instance_types]

    @property
    def instance_store(self) -> bool:
        """Every type has NVMe instance store: containerd's data (and image pulls) go to a RAID0
        of it, the root volume keeps the OS. A pool mixing in a type without keeps EBS for all."""
        return all(t.nvme for t in self.types)

    def root_throughput_mibps(self) -> int:
        """The root volume's gp3 throughput: configured, else by whether pulls write to it."""
        return self.disk_throughput_mibps or ROOT_THROUGHPUT_MIBPS[self.instance_store]

    @property
    def gpu(self) -> bool:
        return self.types[0].gpus > 0

    @property
    def gpus_per_node(self) -> int:
        """GPUs on the smallest node of the pool: what one pod per node can safely request."""
        return min(t.gpus for t in self.types)

    @property
    def procs_per_node(self) -> int:
        """Trainer processes per node: one per GPU; one on CPU pools (gloo)."""
        return self.gpus_per_node if self.gpu else 1

    @property
    def efa_network_cards(self) -> int:
        """EFA interfaces every instance type of the pool can take (one per network card)."""
        return min(t.efa_network_cards for t in self.types) if self.efa else 0

    def job_pod_requests(self) -> tuple[int, int]:
        """(vCPU, GiB of memory) one job pod requests on this pool.

        A GPU pod has its node to itself (it asks for every GPU), so it asks for the room the
        pool's smallest node leaves (pod_room). A CPU pod asks for a fixed slice, several to a
        node.
        """
        if not self.gpu:
            return 2, 8
        return smallest_room(self.types)

    def fabric_check_plan(self, nodes: int | None = None) -> FabricCheckPlan:
        """The fabric check on `nodes` nodes (default: fabricCheck.nodes), with its floors."""
        check = self.fabric_check
        nodes = nodes or check.nodes
        floors: tuple[BusbwFloor, ...] = ()
        if check.floors is not None:
            floors = tuple(check.floors)
            basis = "floors from stack config" if floors else "no floor (stack config: floors [])"
        else:
            floors, basis = self._published_floors(nodes)
        largest = max((f.to_bytes or f.from_bytes for f in floors), default=0)
        max_bytes = check.max_bytes or max(largest, FABRIC_DEFAULT_MAX_BYTES)
        return FabricCheckPlan(nodes, max_bytes, floors, basis)

    def _published_floors(self, nodes: int) -> tuple[tuple[BusbwFloor, ...], str]:
        """The default floor: PUBLISHED_FLOOR_SHARE of the lowest published figure among the
        pool's families, when every family has one measured on this many nodes."""
        published = load_published_busbw()
        families = sorted({t.family for t in self.types})
        missing = [f for f in families if f not in published]
        if missing:
            return (), f"no floor: no published all_reduce_perf figure for {', '.join(missing)}"
        lowest = min((published[f] for f in families), key=lambda p: p.busbw)
        if lowest.nodes != nodes:
            return (), (
                f"no floor: the published {lowest.family} figure was measured on {lowest.nodes} "
                f"nodes, this check runs {nodes}"
            )
        floor = BusbwFloor.model_validate(
            {"fromBytes": lowest.bytes, "minBusbw": round(lowest.busbw * PUBLISHED_FLOOR_SHARE, 2)}
        )
        return (floor,), (
            f"default floor: {PUBLISHED_FLOOR_SHARE:.0%} of the published {lowest.family} figure "
            f"{lowest.busbw} GB/s at {lowest.bytes} B on {lowest.nodes} nodes ({lowest.source}); "
            "replace it with this cluster's measured figure"
        )

    def ceiling(self) -> PoolCeiling:
        """maxNodes times the largest figure among the pool's types, per resource."""
        return PoolCeiling(
            nodes=self.max_nodes,
            gpus=self.max_nodes * max(t.gpus for t in self.types),
            vcpu=self.max_nodes * max(t.vcpu for t in self.types),
            memory_gib=self.max_nodes * max(t.memory_gib for t in self.types),
        )


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
    if not 1 / 60 <= _hours(value) <= 24:
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
    gpu_registration_watch_image: "ImageConfig" = Field(default_factory=lambda: ImageConfig())

    @property
    def gpu_registration_timeout_seconds(self) -> int | None:
        """gpuRegistrationTimeout in seconds; None when it is left to its default."""
        timeout = self.gpu_registration_timeout
        return round(_hours(timeout) * 3600) if timeout else None


class TeamConfig(Model):
    """A team submitting jobs: a namespace with a LocalQueue, optionally its own ClusterQueue."""

    name: K8sName
    namespace: K8sName | None = None  # default: the team name
    # Own ClusterQueue in the platform cohort: no quota of its own, it borrows unused platform
    # quota up to this share of each pool's ceiling, and is reclaimed first when others need it.
    own_cluster_queue: bool = False
    borrowing_limit_percent: int = Field(default=100, ge=1, le=100)

    @property
    def namespace_name(self) -> str:
        return self.namespace or self.name


class QueuesConfig(Model):
    cohort: K8sName = "training-platform"
    reclaim_within_cohort: Literal["Never", "LowerPriority", "Any"] = "Any"
    within_cluster_queue: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] = (
        "LowerPriority"
    )
    teams: list[TeamConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> "QueuesConfig":
        for team in self.teams:
            ns = team.namespace_name
            if ns in SYSTEM_NAMESPACES or ns.startswith("kube-"):
                raise ValueError(
                    f"team {team.name}'s namespace {ns!r} is a system namespace; allowed: any "
                    f"other name (not kube-*, nor {', '.join(SYSTEM_NAMESPACES)})"
                )
        for what, values in (
            ("names", [t.name for t in self.teams]),
            ("namespaces", [t.namespace_name for t in self.teams]),
        ):
            repeated = sorted({v for v in values if values.count(v) > 1})
            if repeated:
                raise ValueError(
                    f"team {what} {', '.join(repeated)} repeat; allowed: unique {what}"
                )
        return self


class MonitoringConfig(Model):
    # kube-prometheus-stack with the DCGM dashboard; the DCGM exporter runs whenever GPUs do.
    prometheus_stack: bool = False


class BucketConfig(Model):
    kms: bool = False  # SSE-KMS with a key of this stack; default SSE-S3
    checkpoint_retention_days: int = Field(default=30, ge=1, le=3650)
    force_destroy: bool = False  # let `pulumi destroy` delete a bucket that still holds objects


class EfsConfig(Model):
    enabled: bool = True


class FsxConfig(Model):
    """FSx for Lustre PERSISTENT_2, linked to the bucket's `datasetPrefix` (auto import/export)."""

    enabled: bool = False
    storage_capacity_gib: int = 1200
    throughput_per_tib: Literal[125, 250, 500, 1000] = 125
    dataset_prefix: str = Field(
        default="datasets", pattern=r"^[a-zA-Z0-9!_.*'()-]+(/[a-zA-Z0-9!_.*'()-]+)*$"
    )

    @model_validator(mode="after")
    def _capacity(self) -> "FsxConfig":
        segments = self.dataset_prefix.split("/")
        if {".", ".."} & set(segments):
            raise ValueError(
                f"datasetPrefix {self.dataset_prefix!r} has a . or .. segment; allowed: a plain "
                "S3 prefix such as datasets or datasets/text"
            )
        checkpoints = CHECKPOINT_PREFIX.rstrip("/")
        if segments[0] == checkpoints:
            raise ValueError(
                f"datasetPrefix {self.dataset_prefix!r} lies under the checkpoint prefix "
                f"{CHECKPOINT_PREFIX}; allowed: a prefix outside it, such as datasets"
            )
        capacity = self.storage_capacity_gib
        if capacity != 1200 and (capacity < 2400 or capacity % 2400):
            raise ValueError(
                f"storageCapacityGib {capacity}; allowed for PERSISTENT_2 SSD: 1200 or a multiple "
                "of 2400 (2400, 4800, ...)"
            )
        return self


class StorageConfig(Model):
    bucket: BucketConfig = BucketConfig()
    efs: EfsConfig = EfsConfig()
    fsx: FsxConfig = FsxConfig()


class PolicyConfig(Model):
    """Policy pack settings; a real preview takes the same keys via --policy-pack-config."""

    budget_usd_per_hour: float = Field(default=1000, gt=0, allow_inf_nan=False)
    allowed_public_ingress: list[str] = Field(default_factory=list)  # resource names
    production_stacks: list[str] = Field(default_factory=lambda: list(MANDATORY_PRODUCTION_STACKS))

    @model_validator(mode="after")
    def _guards_stay_on(self) -> "PolicyConfig":
        dropped = [s for s in MANDATORY_PRODUCTION_STACKS if s not in self.production_stacks]
        if dropped:
            raise ValueError(
                f"productionStacks leaves out {', '.join(dropped)}; allowed: a list that "
                f"includes {', '.join(MANDATORY_PRODUCTION_STACKS)} (a stack file may add "
                "production stacks, not switch their guards off)"
            )
        return self


class ImageConfig(Model):
    # A prebuilt trainer image by digest; empty: build trainer/Dockerfile and push it to ECR.
    uri: str = Field(
        default="", pattern=r"^$|^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+@sha256:[a-f0-9]{64}$"
    )


class JobConfig(Model):
    """A training job: the trainer on `nodePool`, admitted through a team's queue."""

    name: K8sName
    kind: Literal["PyTorchJob", "MPIJob"] = "PyTorchJob"
    node_pool: K8sName
    min_nodes: int = Field(default=1, ge=1, le=1000)
    max_nodes: int = Field(default=1, ge=1, le=1000)
    queue: K8sName  # a team name from queues.teams
    args: list[str] = Field(default_factory=list)  # trainer arguments (python -m trainer --help)
    checkpoint: Literal["s3", "fsx", "efs"] = "s3"
    max_restarts: int = Field(default=3, ge=0, le=100)

    @model_validator(mode="after")
    def _range(self) -> "JobConfig":
        if self.name == "default":
            raise ValueError(
                "a job named default would bind its S3 role to every pod of the namespace "
                "(Pod Identity follows the service account, named after the job); allowed: "
                "any other name"
            )
        if self.min_nodes > self.max_nodes:
            raise ValueError(
                f"minNodes {self.min_nodes} > maxNodes {self.max_nodes}; "
                "allowed: minNodes <= maxNodes"
            )
        if self.kind == "MPIJob" and self.min_nodes != self.max_nodes:
            raise ValueError("an MPIJob is not elastic; allowed: minNodes == maxNodes")
        return self


class DevServerFlavorConfig(Model):
    """A DevServer size: what each of its pods asks for on `nodePool`, one pod per node at most."""

    name: K8sName
    node_pool: K8sName
    gpus: int = Field(default=0, ge=0, le=64)
    cpu: int = Field(ge=1, le=512)
    memory_gib: int = Field(ge=1, le=4096)


class DevServerQuota(Model):
    servers: int = Field(default=2, ge=1, le=100)
    gpus: int = Field(default=8, ge=0, le=1024)
    # gp3 home volumes of all the user's servers, running, stopped or kept after a delete or a
    # shrink: a ResourceQuota caps them, and the plan prices the cap.
    home_gib: int = Field(default=500, ge=1, le=65536)


class DevServerUser(Model):
    """A developer: namespace dev-<name>, admitted through their team's queue."""

    name: K8sName
    email: Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")]
    team: K8sName  # a team from queues.teams
    quota: DevServerQuota = DevServerQuota()
    iam_principal_arn: IamPrincipalArn


class DevServerIdle(Model):
    """The platform's idle floors (a server may set its own in spec.lifecycle): a server with no
    SSH session is idle with its GPUs at or below gpuPercent, or, without a GPU figure (CPU
    flavors), with CPU use between two checks at or below cpuPercent of one core."""

    gpu_percent: int = Field(default=5, ge=0, le=100)
    cpu_percent: int = Field(default=10, ge=0, le=10000)


class DevServersConfig(Model):
    """Self-service development servers: the operator, its flavors and its users."""

    enabled: bool = False
    flavors: list[DevServerFlavorConfig] = Field(default_factory=list)
    users: list[DevServerUser] = Field(default_factory=list)
    idle: DevServerIdle = DevServerIdle()
    # Source ranges a DevServer's SSH LoadBalancer accepts; empty: SSH only by port-forward.
    ssh_load_balancer_cidrs: list[Cidr] = Field(default_factory=list)
    # A prebuilt operator image by digest; empty: build devservers/Dockerfile and push it to ECR.
    operator_image: ImageConfig = ImageConfig()

    def flavor(self, name: str) -> DevServerFlavorConfig:
        """The flavor `name`, else a ValueError naming a close one and the allowed ones."""
        return _named(self.flavors, name, f"unknown flavor {name!r}")

    def user(self, name: str) -> DevServerUser:
        """The user `name`, else a ValueError naming a close one and the allowed ones."""
        return _named(self.users, name, f"{name!r} is not a DevServers user")


def _named(items: list, name: str, unknown: str):
    names = [item.name for item in items]
    if name not in names:
        raise ValueError(
            f"{unknown}; {_did_you_mean(name, names)}" + _allowed(names, "none declared")
        )
    return items[names.index(name)]


def dev_servers_errors(config: "StackConfig") -> list[tuple[tuple, str]]:
    """A DevServers section's flavors fit their pools, users name teams, names are unique."""
    section = config.dev_servers
    teams = [t.name for t in config.queues.teams]
    problems: list[tuple[tuple, str]] = []
    for what, items in (("flavors", section.flavors), ("users", section.users)):
        names = [item.name for item in items]
        for i, name in enumerate(names):
            if names.count(name) > 1:
                problems.append(
                    (("devServers", what, i, "name"), f"{name!r} repeats; allowed: unique names")
                )
    for i, flavor in enumerate(section.flavors):
        loc = ("devServers", "flavors", i)
        pool = config.pool_named(flavor.node_pool)
        if pool is None:
            problems.append(((*loc, "nodePool"), _not_a_pool(flavor.node_pool, config)))
            continue
        if pool.hybrid:
            # A server's pod may land on any machine that holds it, then stays on the one its
            # home is on (infra/components/hybrid_homes.py): it must fit one machine at least,
            # with the room a job pod gets there (pod_room).
            rooms = {m.name: (m.gpus, *pod_room(m)) for m in pool.machines}
            if not any(
                flavor.gpus <= gpus and flavor.cpu <= vcpu and flavor.memory_gib <= memory
                for gpus, vcpu, memory in rooms.values()
            ):
                problems.append(
                    (
                        loc,
                        f"{flavor.gpus} GPUs, {flavor.cpu} vCPU, {flavor.memory_gib} GiB fits none "
                        "of the hybrid machines; allowed: at most "
                        + "; ".join(
                            f"{gpus} GPUs, {vcpu} vCPU, {memory} GiB ({name})"
                            for name, (gpus, vcpu, memory) in rooms.items()
                        ),
                    )
                )
            continue
        if pool.topology:
            # Kueue admits onto a topology flavor only pods that ask for topology (the platform
            # queue is not topology-only; kueue pkg/scheduler/flavorassigner/tas_flavorassigner.go,
            # checkPodSetAndFlavorMatchForTAS), and DevServer pods do not.
            problems.append(
                (
                    (*loc, "nodePool"),
                    f"pool {pool.name} places pods by topology (staticNodes), where Kueue admits "
                    "no DevServer; allowed: a pool without staticNodes",
                )
            )
            continue
        # A flavor's pod must fit on the smallest instance type of its pool, or it never
        # schedules: the same room a job pod asks for.
        smallest = min(pool.types, key=lambda t: (t.gpus, t.vcpu, t.memory_gib))
        vcpu, memory_gib = pod_room(smallest)
        limits = {
            "gpus": (flavor.gpus, smallest.gpus),
            "cpu": (flavor.cpu, vcpu),
            "memoryGib": (flavor.memory_gib, memory_gib),
        }
        for key, (asked, most) in limits.items():
            if asked > most:
                problems.append(
                    (
                        (*loc, key),
                        f"{asked} does not fit pool {pool.name}'s {smallest.name}; "
                        f"allowed: at most {most}",
                    )
                )
        if pool.gpu and flavor.gpus == 0:
            problems.append(
                (
                    (*loc, "gpus"),
                    f"0 on GPU pool {pool.name}; allowed: 1 to {smallest.gpus} "
                    "(CPU-only servers belong on a CPU pool)",
                )
            )
    for i, user in enumerate(section.users):
        if user.team not in teams:
            problems.append(
                (
                    ("devServers", "users", i, "team"),
                    f"{user.team!r} is not a team; "
                    + _did_you_mean(user.team, [*teams])
                    + _allowed([*teams], "allowed: none yet, declare queues.teams first"),
                )
            )
    if section.enabled and not section.flavors:
        problems.append((("devServers", "flavors"), "empty; allowed: at least one flavor"))
    return problems


# Address ranges EKS accepts for hybrid nodes' remote node and pod networks (RFC 1918, CGNAT).
HYBRID_ALLOWED_RANGES = [
    ipaddress.IPv4Network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
]


class HybridMachine(Model):
    """A machine outside AWS joining the cluster as an EKS hybrid node."""

    name: K8sName
    gpus: int = Field(ge=0, le=16)
    gpu_model: str = Field(default="", pattern=r"^[A-Za-z0-9 ._-]{0,40}$")
    # What Kueue may admit onto it, with memoryGib and gpus, and what EKS bills per vCPU-hour
    # (it bills every hardware thread the node reports: declare them all).
    vcpu: int = Field(ge=1, le=512)
    memory_gib: int = Field(ge=1, le=8192)

    @model_validator(mode="before")
    @classmethod
    def _no_pod_cidr(cls, data: Any) -> Any:
        if isinstance(data, dict) and "podCidr" in data:
            raise ValueError(
                "podCidr is gone: Cilium's cluster-pool IPAM now gives each node its slice of "
                "remotePodCidrs when it joins (size: hybrid.podCidrMaskSize), and the gateway "
                "routes whatever slice it got; allowed: remove podCidr"
            )
        return data


def _utc_date(value: Any) -> datetime.date:
    """A YYYY-MM-DD date: YAML reads one as a date, the Pulumi engine hands over a string."""
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:
            pass
    raise ValueError(f"{value!r} is not a date; allowed: YYYY-MM-DD (UTC), e.g. 2026-11-22")


class SsmActivation(Model):
    """The machines' SSM hybrid activation: usable until 00:00 UTC `days` days after `start`.

    Registered machines keep working once it expires; only a machine that joins later needs a
    live one. Setting a new `start` and running `pulumi up` replaces it with a fresh one.
    """

    start: Annotated[Any, AfterValidator(_utc_date)]  # the day of the `pulumi up` creating it
    days: int = Field(default=7, ge=1, le=30)  # SSM takes an expiry at most 30 days ahead

    def expiration_date(self) -> str:
        """RFC 3339, as SSM's CreateActivation and the aws provider take it."""
        return f"{self.start + datetime.timedelta(days=self.days)}T00:00:00Z"


class HybridConfig(Model):
    """EKS Hybrid Nodes reached through a WireGuard gateway in a public subnet of the VPC.

    remoteNodeCidrs[0] is the WireGuard network: the gateway takes its first host address, the
    machines the next ones in order (their node IPs).
    """

    remote_node_cidrs: list[Cidr] = Field(min_length=1, max_length=15)
    remote_pod_cidrs: list[Cidr] = Field(min_length=1, max_length=15)
    credential_provider: Literal["ssm", "iam-roles-anywhere"] = "ssm"
    # PEM CA bundle that signs the machines' certificates (iam-roles-anywhere only).
    ca_bundle_pem: str = ""
    ssm_activation: SsmActivation | None = None  # ssm only
    gateway_instance_type: CpuInstanceType = "c6i.large"
    # The prefix of each node's slice of remotePodCidrs (Cilium's clusterPoolIPv4MaskSize): /24
    # holds 254 pods. Cilium hands slices out as nodes join; a change applies to new slices only.
    pod_cidr_mask_size: int = Field(default=24, ge=16, le=28)
    machines: list[HybridMachine] = Field(min_length=1, max_length=100)

    @model_validator(mode="after")
    def _consistent(self) -> "HybridConfig":
        for cidr in self.remote_node_cidrs + self.remote_pod_cidrs:
            if not any(cidr.subnet_of(r) for r in HYBRID_ALLOWED_RANGES):
                raise ValueError(
                    f"{cidr} is not allowed for hybrid nodes; allowed: inside "
                    + ", ".join(str(r) for r in HYBRID_ALLOWED_RANGES)
                )
        if (self.credential_provider == "iam-roles-anywhere") != bool(self.ca_bundle_pem):
            raise ValueError(
                "caBundlePem goes with credentialProvider iam-roles-anywhere; allowed: a PEM CA "
                "bundle for iam-roles-anywhere, none for ssm"
            )
        if (self.credential_provider == "ssm") != (self.ssm_activation is not None):
            raise ValueError(
                "ssmActivation goes with credentialProvider ssm; allowed: {start: <UTC date of "
                "the pulumi up>, days: 1..30} for ssm, none for iam-roles-anywhere"
            )
        names = [m.name for m in self.machines]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"machine names {', '.join(repeated)} repeat; allowed: unique names")
        if len(self.machines) + 1 > self.remote_node_cidrs[0].num_addresses - 2:
            raise ValueError(
                f"remoteNodeCidrs[0] {self.remote_node_cidrs[0]} holds fewer addresses than the "
                f"gateway and {len(self.machines)} machines need"
            )
        widest = min(c.prefixlen for c in self.remote_pod_cidrs)
        if self.pod_cidr_mask_size < max(c.prefixlen for c in self.remote_pod_cidrs):
            raise ValueError(
                f"podCidrMaskSize /{self.pod_cidr_mask_size} is wider than a remotePodCidrs "
                "entry; allowed: at least the longest prefix among remotePodCidrs"
            )
        slices = sum(2 ** (self.pod_cidr_mask_size - c.prefixlen) for c in self.remote_pod_cidrs)
        if slices < len(self.machines):
            raise ValueError(
                f"remotePodCidrs have room for {slices} node slice(s) of "
                f"/{self.pod_cidr_mask_size} and {len(self.machines)} machines need one each; "
                f"allowed: a larger podCidrMaskSize (at most 28) or wider remotePodCidrs (the "
                f"widest is /{widest})"
            )
        return self

    def addresses(self) -> tuple[ipaddress.IPv4Address, dict[str, ipaddress.IPv4Address]]:
        """(gateway, machine name -> node IP) in the WireGuard network remoteNodeCidrs[0]."""
        hosts = self.remote_node_cidrs[0].hosts()
        gateway = next(hosts)
        return gateway, {m.name: next(hosts) for m in self.machines}

    def pool(self, nodes: int = 1) -> "HybridPool":
        return HybridPool(tuple(self.machines), nodes)


@dataclass(frozen=True)
class HybridPool:
    """The hybrid machines as the pool a job names with `nodePool: hybrid`.

    A job pod has a machine to itself, as on a GPU pool a node: a job of `nodes` pods is sized
    for the `nodes` largest machines (by GPUs, then vCPU, then memory), each pod asking for the
    GPUs and the pod room of the smallest of those, so that each of them holds one. The Kueue
    flavor's quota and the most pods a job may have count every machine.
    """

    machines: tuple[HybridMachine, ...]
    nodes: int = 1

    hybrid: ClassVar[bool] = True
    name: ClassVar[str] = HYBRID_POOL
    # What an EC2 pool may have and machines outside AWS have not.
    efa: ClassVar[bool] = False
    efa_network_cards: ClassVar[int] = 0
    topology: ClassVar[bool] = False
    # The same rule as a NodePool's: one trainer process per GPU, one on CPU machines (gloo).
    procs_per_node = NodePoolConfig.procs_per_node

    @property
    def max_nodes(self) -> int:
        return len(self.machines)

    @property
    def sized_for(self) -> list[HybridMachine]:
        by_size = sorted(self.machines, key=lambda m: (m.gpus, m.vcpu, m.memory_gib), reverse=True)
        return by_size[: self.nodes]

    @property
    def gpus_per_node(self) -> int:
        return min(m.gpus for m in self.sized_for)

    @property
    def gpu(self) -> bool:
        return self.gpus_per_node > 0

    def job_pod_requests(self) -> tuple[int, int]:
        return smallest_room(self.sized_for)

    def ceiling(self) -> PoolCeiling:
        """Every machine's figures added up: the Kueue flavor's quota."""
        return PoolCeiling(
            nodes=len(self.machines),
            gpus=sum(m.gpus for m in self.machines),
            vcpu=sum(m.vcpu for m in self.machines),
            memory_gib=sum(m.memory_gib for m in self.machines),
        )


Pool = NodePoolConfig | HybridPool


class StackConfig(Model):
    """The whole `training-platform:` namespace. Later concerns add their sections here."""

    region: Annotated[str, AfterValidator(_known_region)]
    network: NetworkConfig = NetworkConfig()
    cluster: ClusterConfig = ClusterConfig()
    karpenter: KarpenterConfig = KarpenterConfig()
    # Kueue: at most 64 flavors in a ClusterQueue resource group, one flavor per pool.
    node_pools: list[NodePoolConfig] = Field(default_factory=list, max_length=64)
    queues: QueuesConfig = QueuesConfig()
    monitoring: MonitoringConfig = MonitoringConfig()
    storage: StorageConfig = StorageConfig()
    policy: PolicyConfig = PolicyConfig()
    image: ImageConfig = ImageConfig()
    jobs: list[JobConfig] = Field(default_factory=list)
    dev_servers: DevServersConfig = DevServersConfig()
    hybrid: HybridConfig | None = None  # GPUs outside AWS as EKS hybrid nodes

    def pool_named(self, name: str, nodes: int = 1) -> Pool | None:
        """The pool a job or DevServer flavor names: a NodePool, or the hybrid machines sized
        for `nodes` pods (HybridPool); None when there is no such pool."""
        if name == HYBRID_POOL and self.hybrid is not None:
            return self.hybrid.pool(nodes)
        return next((p for p in self.node_pools if p.name == name), None)

    def job_pool(self, job: "JobConfig") -> Pool | None:
        return self.pool_named(job.node_pool, job.max_nodes)

    @model_validator(mode="after")
    def _unique_pool_names(self) -> "StackConfig":
        names = [p.name for p in self.node_pools]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"nodePools names {', '.join(repeated)} repeat; allowed: unique names")
        return self


def parse_stack_config(values: Mapping[str, Any], source: str) -> StackConfig:
    """Validate flat Pulumi config (`aws:region`, `training-platform:<key>`, ...) into StackConfig.

    Values may be JSON strings, as the Pulumi engine hands structured config to the program.
    """
    raw: dict[str, Any] = {}
    for key, value in values.items():
        namespace, _, name = str(key).partition(":")
        if key == "aws:region":
            raw["region"] = value
        elif namespace == NAMESPACE:
            raw[name] = _decode(value)
    header = f"Invalid stack config in {source}:\n"
    if "region" not in raw:
        raise ConfigError(
            f"{header}  aws:region: missing; "
            "allowed: an AWS region, e.g. `pulumi config set aws:region us-west-2`"
        )
    bad_keys = list(_non_string_keys(raw))
    if bad_keys:
        lines = [
            f"  {_key_path(loc, raw)}: key {key!r} is not a string; allowed: camelCase names"
            for loc, key in bad_keys
        ]
        raise ConfigError(header + "\n".join(_one_line(line) for line in lines))
    try:
        config = StackConfig.model_validate(raw)
    except ValidationError as e:
        lines = [f"  {_key_path(err['loc'], raw)}: {_explain(err)}" for err in e.errors()]
        raise ConfigError(header + "\n".join(_one_line(line) for line in lines)) from None
    problems = cross_reference_errors(config) + price_errors(config)
    if problems:
        lines = [f"  {_key_path(loc, raw)}: {message}" for loc, message in problems]
        raise ConfigError(header + "\n".join(_one_line(line) for line in lines))
    return config


def _non_string_keys(value: Any, loc: tuple = ()):
    """(location, key) of every mapping key that is not a string (YAML allows 1:, null:, true:)."""
    if isinstance(value, dict):
        for key, child in value.items():
            if not isinstance(key, str):
                yield loc, key
            else:
                yield from _non_string_keys(child, (*loc, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _non_string_keys(child, (*loc, i))


# What a node keeps back for the kubelet, the OS and the DaemonSets (VPC CNI, kube-proxy, Pod
# Identity agent, CSI node drivers): a job pod needs this much room besides its own requests.
NODE_RESERVE = {"vcpu": 0.5, "memory_gib": 1.5}


def job_pod_fits(pool: NodePoolConfig, instance: InstanceType) -> bool:
    cpu, memory_gib = pool.job_pod_requests()
    return (
        instance.vcpu - NODE_RESERVE["vcpu"] >= cpu
        and instance.memory_gib - NODE_RESERVE["memory_gib"] >= memory_gib
    )


# The resources Kueue's quotas cover, as the messages name them (memory in GiB).
QUOTA_RESOURCES = {"nvidia.com/gpu": "nvidia.com/gpu", "cpu": "cpu", "memory": "GiB memory"}


def job_demand(job: "JobConfig", pool: Pool) -> dict[str, float]:
    """What the whole job's pods ask of its queue, per resource of QUOTA_RESOURCES."""
    cpu, memory_gib = pool.job_pod_requests()
    per_pod = {"nvidia.com/gpu": pool.gpus_per_node if pool.gpu else 0, "cpu": cpu}
    return {r: job.max_nodes * amount for r, amount in {**per_pod, "memory": memory_gib}.items()}


def queue_quota(pool: Pool, team: TeamConfig) -> dict[str, float]:
    """The most of each resource in `pool` that the team's queue can ever admit."""
    ceiling = pool.ceiling()
    amounts = {"nvidia.com/gpu": ceiling.gpus, "cpu": ceiling.vcpu, "memory": ceiling.memory_gib}
    if team.own_cluster_queue:
        return {r: math.ceil(a * team.borrowing_limit_percent / 100) for r, a in amounts.items()}
    return amounts


def queue_shortfall(job: "JobConfig", pool: Pool, team: TeamConfig) -> str | None:
    """`needs N <resource> ... at most M` for the first resource the job asks more of than the
    team's queue can ever admit (Kueue admits a job only when every resource fits), else None.
    On a NodePool, GPUs (or vCPU) bind first; the hybrid machines differ from one another."""
    wanted, quota = job_demand(job, pool), queue_quota(pool, team)
    for resource, name in QUOTA_RESOURCES.items():
        if wanted[resource] > quota[resource]:
            return (
                f"needs {wanted[resource]:g} {name} in pool {pool.name} but team {team.name}'s "
                f"queue can admit at most {quota[resource]:g}"
            )
    return None


def cross_reference_errors(config: StackConfig) -> list[tuple[tuple, str]]:
    """Checks between sections (a job's pool, queue and storage), once each section is valid."""
    pools = {p.name: p for p in config.node_pools}
    teams = {t.name: t for t in config.queues.teams}
    storage = {"s3": True, "fsx": config.storage.fsx.enabled, "efs": config.storage.efs.enabled}
    problems: list[tuple[tuple, str]] = []
    if not pools and (config.queues.teams or config.jobs):
        problems.append(
            (
                ("nodePools",),
                "is empty but queues.teams or jobs need capacity; allowed: at least one pool",
            )
        )
    elif not pools and config.hybrid is None:
        # Kueue's CRD refuses a ClusterQueue without flavors (resourceGroups[].flavors minItems 1).
        problems.append(
            (
                ("nodePools",),
                "is empty, which leaves the platform ClusterQueue without a flavor (Kueue refuses "
                "it) and the platform without capacity; allowed: at least one pool",
            )
        )
    for i, pool in enumerate(config.node_pools):
        zone, loc = pool.availability_zone, ("nodePools", i, "availabilityZone")
        if zone and zone[:-1] != config.region:
            problems.append(
                (
                    loc,
                    f"pool {pool.name}: {zone} is not in region {config.region}; allowed: "
                    f"{config.region}a, {config.region}b, ...",
                )
            )
        if pool.efa and not zone:
            problems.append(
                (
                    loc,
                    f"pool {pool.name}: missing; an EFA pool keeps its nodes in one cluster "
                    "placement group, which lives in one AZ; allowed: an AZ of the stack's "
                    f"subnets where {', '.join(pool.instance_types)} is offered, e.g. "
                    f"{config.region}a (python -m infra.preflight checks the offering)",
                )
            )
        too_small = [t.name for t in pool.types if not job_pod_fits(pool, t)]
        if too_small and config.jobs:
            cpu, memory_gib = pool.job_pod_requests()
            problems.append(
                (
                    ("nodePools", i, "instanceTypes"),
                    f"{', '.join(too_small)} cannot hold a job pod ({cpu} vCPU, {memory_gib} GiB "
                    f"after about {NODE_RESERVE['vcpu']} vCPU and {NODE_RESERVE['memory_gib']} "
                    "GiB node reserve); allowed: larger types",
                )
            )
        if pool.name == HYBRID_POOL:
            problems.append(
                (
                    ("nodePools", i, "name"),
                    f"{HYBRID_POOL} is the name of the hybrid machines' pool (their node label "
                    "and Kueue flavor); allowed: any other name",
                )
            )
    names = [j.name for j in config.jobs]
    for i, job in enumerate(config.jobs):
        loc = ("jobs", i)
        if names.count(job.name) > 1:
            problems.append(((*loc, "name"), f"{job.name!r} repeats; allowed: unique job names"))
        pool = config.job_pool(job)
        team = teams.get(job.queue)
        if pool is None:
            problems.append(((*loc, "nodePool"), _not_a_pool(job.node_pool, config)))
        elif job.max_nodes > pool.max_nodes:
            most = (
                f"the {pool.max_nodes} hybrid machines (one pod each)"
                if pool.hybrid
                else f"pool {pool.name}'s maxNodes {pool.max_nodes}"
            )
            problems.append(
                (
                    (*loc, "maxNodes"),
                    f"{job.max_nodes} exceeds {most}; allowed: at most {pool.max_nodes}",
                )
            )
        elif team is not None:
            shortfall = queue_shortfall(job, pool, team)
            if shortfall:
                problems.append(
                    (
                        (*loc, "maxNodes"),
                        f"{shortfall}; allowed: fewer nodes, or a larger borrowingLimitPercent or "
                        "pool",
                    )
                )
        if team is None:
            problems.append(
                (
                    (*loc, "queue"),
                    f"{job.queue!r} is not a team queue; {_did_you_mean(job.queue, [*teams])}"
                    + _allowed([*teams], "allowed: none yet, declare queues.teams first"),
                )
            )
        problems += [((*loc, "args"), message) for message in _job_args_errors(job)]
        if pool is not None and pool.hybrid and job.checkpoint != "s3":
            # The EFS and FSx CSI node agents do not run on hybrid nodes (README, Cluster mode).
            problems.append(
                (
                    (*loc, "checkpoint"),
                    f"{job.checkpoint} is not mounted on the hybrid machines, whose nodes run no "
                    "EFS or FSx CSI agent; allowed: s3",
                )
            )
        elif not storage[job.checkpoint]:
            problems.append(
                (
                    (*loc, "checkpoint"),
                    f"{job.checkpoint} is not enabled in storage; allowed: "
                    + ", ".join(k for k, on in storage.items() if on),
                )
            )
    return (
        problems
        + _hybrid_errors(config)
        + dev_servers_errors(config)
        + _ami_release_errors(config)
        + _public_ingress_errors(config)
    )


def _ami_release_errors(config: StackConfig) -> list[tuple[tuple, str]]:
    """Karpenter finds AMIs of a release for the cluster's Kubernetes version only."""
    version = config.cluster.kubernetes_version
    first = f"al2023@{AL2023_FIRST_RELEASE[version]}"
    if config.karpenter.ami_alias >= first:  # one format, al2023@vYYYYMMDD: text order is time
        return []
    return [
        (
            ("karpenter", "amiAlias"),
            f"{config.karpenter.ami_alias} has no AMI for Kubernetes {version}: the first AL2023 "
            f"release for Kubernetes {version} is {first.removeprefix('al2023@')}; allowed: "
            f"{first} or later",
        )
    ]


HYBRID_GATEWAY = "hybrid-gateway"


def public_ingress_resources(config: StackConfig) -> list[str]:
    """What this stack opens to the internet on purpose, by resource name: the WireGuard
    gateway's security group of the hybrid section. policy.allowedPublicIngress names these."""
    return [HYBRID_GATEWAY] if config.hybrid else []


def _public_ingress_errors(config: StackConfig) -> list[tuple[tuple, str]]:
    opened = public_ingress_resources(config)
    return [
        (
            ("policy", "allowedPublicIngress", i),
            f"{name!r} is not a resource this stack opens to the internet; "
            + _did_you_mean(name, opened)
            + _allowed(
                opened,
                f"allowed: none, nothing here faces the internet ({HYBRID_GATEWAY} "
                "comes with a hybrid section)",
            ),
        )
        for i, name in enumerate(config.policy.allowed_public_ingress)
        if name not in opened
    ]


def eks_service_cidr(vpc_cidr: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    """The Kubernetes service CIDR EKS picks when the cluster sets none, as this program's does.

    EKS takes 172.20.0.0/16 when the VPC is in 10.0.0.0/8 and 10.100.0.0/16 otherwise (EKS API,
    KubernetesNetworkConfigRequest.serviceIpv4Cidr names the two; the choice is the one the
    EKS AMI's bootstrap makes for the cluster DNS IP: awslabs/amazon-eks-ami,
    templates/al2/runtime/bootstrap.sh, "Detected VPC CIDR (IPv4) in 10.0.0.0/8 range").
    """
    if vpc_cidr.subnet_of(ipaddress.IPv4Network("10.0.0.0/8")):
        return ipaddress.IPv4Network("172.20.0.0/16")
    return ipaddress.IPv4Network("10.100.0.0/16")


def _hybrid_errors(config: StackConfig) -> list[tuple[tuple, str]]:
    """Hybrid nodes against the rest of the stack: endpoint mode and the VPC's addresses."""
    if config.hybrid is None:
        return []
    problems = []
    endpoint = config.cluster.endpoint
    if endpoint.public_access and endpoint.private_access:
        problems.append(
            (
                ("cluster", "endpoint"),
                "hybrid nodes need publicAccess or privateAccess, not both (the endpoint would "
                "resolve to public IPs for nodes outside the VPC); allowed: one of them true",
            )
        )
    # EKS refuses remote networks that overlap each other, the VPC or the service CIDR (EKS
    # user guide, "Prepare networking for hybrid nodes"); the VPC's routes would misdirect them.
    vpc, services = config.network.cidr, eks_service_cidr(config.network.cidr)
    taken = [("the VPC cidr", vpc), ("the cluster's service CIDR", services)]
    remote = {
        "remoteNodeCidrs": config.hybrid.remote_node_cidrs,
        "remotePodCidrs": config.hybrid.remote_pod_cidrs,
    }
    for key, cidrs in remote.items():
        for i, cidr in enumerate(cidrs):
            clash = next(((what, c) for what, c in taken if cidr.overlaps(c)), None)
            if clash:
                problems.append(
                    (
                        ("hybrid", key, i),
                        f"{cidr} overlaps {clash[0]} {clash[1]}; allowed: a range outside "
                        f"the VPC ({vpc}), the service CIDR ({services}) and the other remote "
                        "CIDRs",
                    )
                )
            taken.append((f"hybrid.{key}[{i}]", cidr))
    if config.network.existing_vpc is not None:
        problems.append(
            (
                ("hybrid",),
                "hybrid nodes need routes in the VPC's route tables, which an adopted VPC "
                "(network.existingVpc) keeps to itself; allowed: hybrid with this stack's VPC",
            )
        )
    return problems


def price_errors(config: StackConfig) -> list[tuple[tuple, str]]:
    """The plan prices every node at the stack's region: each type and store needs a price there."""
    try:
        prices = load_prices(config.region)
    except UnpricedError as e:
        return [(("region",), str(e))]
    wanted = [
        (
            ("cluster", "systemNodeGroup", "instanceType"),
            config.cluster.system_node_group.instance_type,
        )
    ]
    for i, pool in enumerate(config.node_pools):
        wanted += [
            (("nodePools", i, "instanceTypes", j), t) for j, t in enumerate(pool.instance_types)
        ]
    if config.hybrid is not None:
        wanted.append((("hybrid", "gatewayInstanceType"), config.hybrid.gateway_instance_type))
    problems = []
    for loc, name in wanted:
        try:
            prices.instance(name)
        except UnpricedError as e:
            problems.append((loc, str(e)))
    if config.storage.fsx.enabled:
        try:
            prices.fsx(config.storage.fsx.throughput_per_tib)
        except UnpricedError as e:
            problems.append((("storage", "fsx", "throughputPerTib"), str(e)))
    return problems


# Documentation values (RFC 5737 networks, AWS's example account) that Pulumi.prod.yaml ships as
# placeholders: a real deployment with them would lock the real admins out of the cluster.
DOCUMENTATION_CIDRS = [
    ipaddress.IPv4Network(c) for c in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
]
DOCUMENTATION_ACCOUNT = "123456789012"


def placeholder_errors(config: StackConfig) -> list[str]:
    """`key: message` per key still holding a documentation placeholder; the engine refuses them."""
    endpoint = ("cluster", "endpoint", "publicAccessCidrs")
    problems = [
        ((*endpoint, i), f"{cidr} is a documentation range (RFC 5737); allowed: your own CIDRs")
        for i, cidr in enumerate(config.cluster.endpoint.public_access_cidrs)
        if any(cidr.subnet_of(doc) for doc in DOCUMENTATION_CIDRS)
    ]
    problems += [
        (
            ("cluster", "adminPrincipalArns", i),
            f"{arn} is in AWS's documentation account {DOCUMENTATION_ACCOUNT}; "
            "allowed: a role or user of your account",
        )
        for i, arn in enumerate(config.cluster.admin_principal_arns)
        if f":{DOCUMENTATION_ACCOUNT}:" in arn
    ]
    return [f"{_key_path(loc)}: {message}" for loc, message in problems]


class _StackFileLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key (a list or a mapping)
                raise yaml.constructor.ConstructorError(
                    None, None, "a key must be a plain value", key_node.start_mark
                ) from None
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    f"the key {key!r} first given",
                    first.start_mark,
                    "is given again (duplicate key)",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def _load_yaml(path: Path) -> Any:
    try:
        with path.open(encoding="utf-8") as stream:  # marks in errors name the file
            return yaml.load(stream, Loader=_StackFileLoader)
    except UnicodeDecodeError as e:
        raise ConfigError(f"Invalid stack config in {path.name}: not UTF-8 text ({e})") from None
    except yaml.YAMLError as e:
        detail = " ".join(str(e).split())
        raise ConfigError(f"Invalid stack config in {path.name}: not YAML: {detail}") from None


def read_stack_file(stack: str, project_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """The `config:` map of Pulumi.<stack>.yaml, as the Pulumi CLI would pass it."""
    path = project_dir / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        stacks = sorted(
            p.name[len("Pulumi.") : -len(".yaml")] for p in project_dir.glob("Pulumi.*.yaml")
        )
        raise ConfigError(
            f"No stack file {path.name}; "
            + (f"allowed stacks: {', '.join(stacks)}" if stacks else "no Pulumi.<stack>.yaml here")
        )
    document = _load_yaml(path) or {}
    config = document.get("config", {}) if isinstance(document, dict) else None
    if not isinstance(config, dict):
        raise ConfigError(f"Invalid stack config in {path.name}: `config` must be a mapping")
    return config


def load_stack_file(stack: str, project_dir: Path = PROJECT_DIR) -> StackConfig:
    return parse_stack_config(read_stack_file(stack, project_dir), f"Pulumi.{stack}.yaml")


def load_stack_for_command(stack: str) -> StackConfig | None:
    """For command-line tools: the stack's config, or None after printing why it is invalid
    (the caller exits 2)."""
    try:
        return load_stack_file(stack)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


def config_from_pulumi() -> StackConfig:
    """The running stack's config, read from the Pulumi runtime (real engine or mocks)."""
    from pulumi.runtime.config import CONFIG, get_config_env

    stack = pulumi.get_stack()
    # The engine's own YAML reader may keep one of two equal keys; the stack file, when it is
    # here (it is for `pulumi up` from the project), is checked for duplicates by our loader.
    if (PROJECT_DIR / f"Pulumi.{stack}.yaml").is_file():
        read_stack_file(stack, PROJECT_DIR)
    values = {**get_config_env(), **CONFIG.get()}
    source = f"Pulumi.{stack}.yaml"
    config = parse_stack_config(values, source)
    placeholders = placeholder_errors(config)
    if placeholders:
        raise ConfigError(
            f"Invalid stack config in {source}: placeholders left in\n  "
            + "\n  ".join(placeholders)
        )
    return config


def _job_args_errors(job: "JobConfig") -> list[str]:
    """What the trainer would refuse in this job's arguments, by the trainer's own parser."""
    try:
        parse_options(job.args)
    except OptionsError as e:
        return [f"{e}; see python -m trainer --help"]
    if "--checkpoint-dir" in job.args:
        return ["--checkpoint-dir is set by the platform from `checkpoint`; allowed: leave it out"]
    return []


def _one_line(message: str) -> str:
    """Control characters from the config (a key, an argument) escaped: one error, one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


def _decode(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _key_path(loc: tuple, raw: Any = None) -> str:
    """`training-platform:nodePools[gpu-small].maxNodes`: list items by name where they have one."""
    if loc[:1] == ("region",):
        return "aws:region"
    path = f"{NAMESPACE}:"
    node = raw
    for i, part in enumerate(loc):
        if isinstance(part, int) and not isinstance(part, bool):
            item = node[part] if isinstance(node, list) and part < len(node) else None
            name = item.get("name") if isinstance(item, dict) else None
            if isinstance(name, str) and re.fullmatch(r"[a-z0-9-]{1,63}", name):
                path += f"[{name}]"
            else:
                path += f"[{part}]"
        elif not isinstance(part, str) or not re.fullmatch(r"[\w.-]+", part):
            # a key with spaces or control characters stays one line
            path += f"[{json.dumps(part if isinstance(part, str) else repr(part))}]"
        else:
            path += part if i == 0 else f".{part}"
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            node = None
    return path


def _explain(err: dict) -> str:
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(err["loc"][:-1])
        key = str(err["loc"][-1])
        return f"unknown key; {_did_you_mean(key, allowed)}" + _allowed(
            allowed, "allowed: no keys here"
        ).replace("allowed:", "allowed keys here:")
    if err["type"] == "missing":
        return "missing; this key is required"
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "string_pattern_mismatch":
        hint = PATTERN_HINTS.get(err["ctx"]["pattern"])
        message = f"does not match {err['ctx']['pattern']}" + (f"; allowed: {hint}" if hint else "")
    if err["type"] in {"model_type", "dict_type", "model_attributes_type"}:
        message = "must be a mapping of keys to values"
    return message


def _allowed_keys(loc: tuple) -> list[str]:
    """The camelCase keys a model accepts at `loc`, found by walking StackConfig's annotations."""
    annotation: Any = StackConfig
    for part in loc:
        annotation = _model_in(annotation)
        if isinstance(part, int) or annotation is None:
            continue
        field = next(
            (f for n, f in annotation.model_fields.items() if (f.alias or n) == part), None
        )
        annotation = field.annotation if field else None
    model = _model_in(annotation)
    if model is None:
        return []
    # aws:region comes from the aws namespace, not from a training-platform key.
    return sorted(f.alias or n for n, f in model.model_fields.items() if n != "region")


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside Optional[...] / list[...] / Annotated[...], or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if (
        get_origin(annotation) in (Union, list, Annotated)
        or type(annotation).__name__ == "UnionType"
    ):
        for arg in get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None
