"""Typed stack config: the `training-platform:` namespace of `Pulumi.<stack>.yaml`, validated once.

Every key is camelCase in YAML, as Pulumi config is written. A bad value stops the program with a
single ConfigError that names each offending key path and what is allowed there.
"""

import ipaddress
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

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

from infra.catalog import InstanceType, RegionPrices, UnpricedError, load_catalog, load_prices
from infra.paths import PROJECT_DIR
from infra.versions import EKS_ADDONS, KARPENTER_AMI_ALIAS
from trainer.options import OptionsError, parse_options

NAMESPACE = "training-platform"


class ConfigError(pulumi.RunError):
    """Invalid stack config. A RunError, so `pulumi up` prints the message without a traceback."""


class Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, frozen=True, hide_input_in_errors=True
    )


def _ipv4_network(value: Any) -> ipaddress.IPv4Network:
    if not isinstance(value, str):
        raise ValueError("must be a string such as 10.0.0.0/16")
    try:
        return ipaddress.IPv4Network(value, strict=True)
    except ValueError:
        raise ValueError(
            f"{value!r} is not an IPv4 CIDR; allowed: a network address with prefix, "
            "such as 10.0.0.0/16 (host bits zero)"
        ) from None


Cidr = Annotated[Any, AfterValidator(_ipv4_network)]


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
K8sName = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")]
Duration = Annotated[str, Field(pattern=r"^([0-9]+[smh])+$")]
VpcId = Annotated[str, Field(pattern=r"^vpc-[0-9a-f]{8,17}$")]
SubnetId = Annotated[str, Field(pattern=r"^subnet-[0-9a-f]{8,17}$")]
IamPrincipalArn = Annotated[
    str, Field(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$")
]


class ExistingVpc(Model):
    """Adopt a VPC someone else owns: the program tags its subnets but creates none."""

    vpc_id: VpcId
    private_subnet_ids: list[SubnetId] = Field(min_length=2, max_length=6)
    public_subnet_ids: list[SubnetId] = Field(default_factory=list, max_length=6)


class NetworkConfig(Model):
    cidr: Cidr = Field(default="10.0.0.0/16", validate_default=True)
    az_count: int = Field(default=2, ge=2, le=3)
    nat_gateways: Literal["single", "perAz"] = "single"
    # Explicit subnet CIDRs, one per AZ; by default they are carved from `cidr`.
    private_subnet_cidrs: list[Cidr] | None = None
    public_subnet_cidrs: list[Cidr] | None = None
    existing_vpc: ExistingVpc | None = None

    @model_validator(mode="after")
    def _subnets_fit(self) -> "NetworkConfig":
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
    public_access_cidrs: list[Cidr] = Field(
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
    name: str = Field(default="training-platform", pattern=r"^[a-zA-Z][a-zA-Z0-9-]{0,62}$")
    kubernetes_version: Literal[tuple(EKS_ADDONS)] = next(iter(EKS_ADDONS))  # type: ignore[valid-type]
    endpoint: EndpointAccess = EndpointAccess()
    # IAM principals given cluster-admin through EKS access entries.
    admin_principal_arns: list[IamPrincipalArn] = Field(default_factory=list)
    system_node_group: NodeGroupConfig = NodeGroupConfig()
    deletion_protection: bool = False


class PoolCeiling(BaseModel):
    """The most a NodePool can ever hold; Karpenter limits and Kueue quotas both come from it."""

    nodes: int
    gpus: int
    vcpu: int
    memory_gib: int


class NodePoolConfig(Model):
    """A Karpenter NodePool. GPU or CPU follows from its instance types, which may not mix."""

    name: K8sName
    instance_types: list[InstanceTypeName] = Field(min_length=1)
    max_nodes: int = Field(ge=1, le=1000)
    capacity_types: list[Literal["on-demand", "spot"]] = Field(default=["on-demand"], min_length=1)
    efa: bool = False
    # EFA pools keep their nodes in one AZ and one cluster placement group; default: the first AZ
    # of the VPC the program creates (required with an existing VPC).
    availability_zone: str | None = Field(default=None, pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$")
    disk_size_gib: int = Field(default=200, ge=50, le=16000)
    expire_after: Duration = "720h"

    @model_validator(mode="after")
    def _consistent(self) -> "NodePoolConfig":
        if len(set(self.capacity_types)) != len(self.capacity_types):
            raise ValueError(
                "capacityTypes repeats a value; allowed: on-demand and/or spot, once each"
            )
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

    @property
    def types(self) -> list[InstanceType]:
        return [load_catalog()[name] for name in self.instance_types]

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

        A GPU pod has its node to itself (it asks for every GPU), so it asks for what the pool's
        smallest node leaves after EC2's memory overhead, the kubelet's reservations and the
        DaemonSets: 90 % of the vCPUs (at least one spare) and 85 % of the memory. A CPU pod
        asks for a fixed slice, several to a node.
        """
        if not self.gpu:
            return 2, 8
        vcpu = min(t.vcpu for t in self.types)
        memory_gib = min(t.memory_gib for t in self.types)
        return min(vcpu - 1, math.floor(vcpu * 0.9)), math.floor(memory_gib * 0.85)

    def ceiling(self) -> PoolCeiling:
        """maxNodes times the largest figure among the pool's types, per resource."""
        return PoolCeiling(
            nodes=self.max_nodes,
            gpus=self.max_nodes * max(t.gpus for t in self.types),
            vcpu=self.max_nodes * max(t.vcpu for t in self.types),
            memory_gib=self.max_nodes * max(t.memory_gib for t in self.types),
        )

    def max_usd_per_hour(self, prices: RegionPrices) -> float:
        """maxNodes times the dearest of the pool's types at the region's on-demand price."""
        return round(self.max_nodes * max(prices.instance(t) for t in self.instance_types), 2)


class KarpenterConfig(Model):
    # Pinned AL2023 release (al2023@vYYYYMMDD): `@latest` would silently roll every node.
    ami_alias: str = Field(default=KARPENTER_AMI_ALIAS, pattern=r"^al2023@v\d{8}$")


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

    budget_usd_per_hour: float = Field(default=1000, gt=0)
    allowed_public_ingress: list[str] = Field(default_factory=list)  # resource names
    production_stacks: list[str] = Field(default_factory=lambda: ["prod"])


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


class DevServerUser(Model):
    """A developer: namespace dev-<name>, admitted through their team's queue."""

    name: K8sName
    email: Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")]
    team: K8sName  # a team from queues.teams
    quota: DevServerQuota = DevServerQuota()
    iam_principal_arn: IamPrincipalArn


class DevServersConfig(Model):
    """Self-service development servers: the operator, its flavors and its users."""

    enabled: bool = False
    flavors: list[DevServerFlavorConfig] = Field(default_factory=list)
    users: list[DevServerUser] = Field(default_factory=list)
    # Source ranges a DevServer's SSH LoadBalancer accepts; empty: SSH only by port-forward.
    ssh_load_balancer_cidrs: list[Cidr] = Field(default_factory=list)
    # A prebuilt operator image by digest; empty: build devservers/Dockerfile and push it to ECR.
    operator_image: ImageConfig = ImageConfig()


# What a node keeps for the kubelet, the OS and the daemonsets: a flavor must leave this free on
# the smallest instance type of its pool, or its pod never schedules.
DEV_SERVER_RESERVED_VCPU = 1
DEV_SERVER_RESERVED_MEMORY_FRACTION = 0.1


def dev_servers_errors(config: "StackConfig") -> list[tuple[tuple, str]]:
    """A DevServers section's flavors fit their pools, users name teams, names are unique."""
    section = config.dev_servers
    pools = {p.name: p for p in config.node_pools}
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
        pool = pools.get(flavor.node_pool)
        if pool is None:
            problems.append(
                (
                    (*loc, "nodePool"),
                    f"{flavor.node_pool!r} is not a node pool; allowed: {', '.join(pools)}",
                )
            )
            continue
        smallest = min(pool.types, key=lambda t: (t.gpus, t.vcpu, t.memory_gib))
        limits = {
            "gpus": (flavor.gpus, smallest.gpus),
            "cpu": (flavor.cpu, smallest.vcpu - DEV_SERVER_RESERVED_VCPU),
            "memoryGib": (
                flavor.memory_gib,
                int(smallest.memory_gib * (1 - DEV_SERVER_RESERVED_MEMORY_FRACTION)),
            ),
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
                    f"{user.team!r} is not a team; allowed: {', '.join(teams)}",
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
    vcpu: int = Field(ge=1, le=512)  # what Kueue may admit onto it, with memoryGib and gpus
    memory_gib: int = Field(ge=1, le=8192)
    # Its slice of remotePodCidrs: the WireGuard gateway routes these pod addresses to it.
    pod_cidr: Cidr


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
    gateway_instance_type: CpuInstanceType = "c6i.large"
    machines: list[HybridMachine] = Field(min_length=1, max_length=100)

    @model_validator(mode="after")
    def _consistent(self) -> "HybridConfig":
        every = self.remote_node_cidrs + self.remote_pod_cidrs
        for cidr in every:
            if not any(cidr.subnet_of(r) for r in HYBRID_ALLOWED_RANGES):
                raise ValueError(
                    f"{cidr} is not allowed for hybrid nodes; allowed: inside "
                    + ", ".join(str(r) for r in HYBRID_ALLOWED_RANGES)
                )
        for i, a in enumerate(every):
            for b in every[i + 1 :]:
                if a.overlaps(b):
                    raise ValueError(f"remote CIDRs {a} and {b} overlap; allowed: disjoint CIDRs")
        if (self.credential_provider == "iam-roles-anywhere") != bool(self.ca_bundle_pem):
            raise ValueError(
                "caBundlePem goes with credentialProvider iam-roles-anywhere; allowed: a PEM CA "
                "bundle for iam-roles-anywhere, none for ssm"
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
        pods = [m.pod_cidr for m in self.machines]
        for machine in self.machines:
            if not any(machine.pod_cidr.subnet_of(c) for c in self.remote_pod_cidrs):
                raise ValueError(
                    f"machine {machine.name}: podCidr {machine.pod_cidr} lies outside "
                    "remotePodCidrs; allowed: a slice of one of them"
                )
            if sum(machine.pod_cidr.overlaps(other) for other in pods) > 1:
                raise ValueError(
                    f"machine {machine.name}: podCidr {machine.pod_cidr} overlaps another "
                    "machine's; allowed: disjoint slices"
                )
        return self

    def addresses(self) -> tuple[ipaddress.IPv4Address, dict[str, ipaddress.IPv4Address]]:
        """(gateway, machine name -> node IP) in the WireGuard network remoteNodeCidrs[0]."""
        hosts = self.remote_node_cidrs[0].hosts()
        gateway = next(hosts)
        return gateway, {m.name: next(hosts) for m in self.machines}


class StackConfig(Model):
    """The whole `training-platform:` namespace. Later concerns add their sections here."""

    region: str = Field(pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
    network: NetworkConfig = NetworkConfig()
    cluster: ClusterConfig = ClusterConfig()
    karpenter: KarpenterConfig = KarpenterConfig()
    node_pools: list[NodePoolConfig] = Field(default_factory=list)
    queues: QueuesConfig = QueuesConfig()
    monitoring: MonitoringConfig = MonitoringConfig()
    storage: StorageConfig = StorageConfig()
    policy: PolicyConfig = PolicyConfig()
    image: ImageConfig = ImageConfig()
    jobs: list[JobConfig] = Field(default_factory=list)
    dev_servers: DevServersConfig = DevServersConfig()
    hybrid: HybridConfig | None = None  # GPUs outside AWS as EKS hybrid nodes

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
        namespace, _, name = key.partition(":")
        if key == "aws:region":
            raw["region"] = value
        elif namespace == NAMESPACE:
            raw[name] = _decode(value)
    if "region" not in raw:
        raise ConfigError(
            f"Invalid stack config in {source}:\n  aws:region: missing; "
            "allowed: an AWS region, e.g. `pulumi config set aws:region us-west-2`"
        )
    try:
        config = StackConfig.model_validate(raw)
    except ValidationError as e:
        lines = [f"  {_key_path(err['loc'])}: {_one_line(_explain(err))}" for err in e.errors()]
        raise ConfigError(f"Invalid stack config in {source}:\n" + "\n".join(lines)) from None
    problems = cross_reference_errors(config) + price_errors(config)
    if problems:
        lines = [f"  {_key_path(loc)}: {_one_line(message)}" for loc, message in problems]
        raise ConfigError(f"Invalid stack config in {source}:\n" + "\n".join(lines))
    return config


def cross_reference_errors(config: StackConfig) -> list[tuple[tuple, str]]:
    """Checks between sections (a job's pool, queue and storage), once each section is valid."""
    pools = {p.name: p for p in config.node_pools}
    teams = [t.name for t in config.queues.teams]
    storage = {"s3": True, "fsx": config.storage.fsx.enabled, "efs": config.storage.efs.enabled}
    problems = []
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
        if pool.efa and not zone and config.network.existing_vpc:
            problems.append(
                (
                    loc,
                    f"pool {pool.name}: missing; an EFA pool in an existing VPC needs it; "
                    "allowed: an AZ of the VPC's private subnets",
                )
            )
    names = [j.name for j in config.jobs]
    for i, job in enumerate(config.jobs):
        loc = ("jobs", i)
        if names.count(job.name) > 1:
            problems.append(((*loc, "name"), f"{job.name!r} repeats; allowed: unique job names"))
        pool = pools.get(job.node_pool)
        if pool is None:
            problems.append(
                (
                    (*loc, "nodePool"),
                    f"{job.node_pool!r} is not a node pool; allowed: {', '.join(pools)}",
                )
            )
        elif job.max_nodes > pool.max_nodes:
            problems.append(
                (
                    (*loc, "maxNodes"),
                    f"{job.max_nodes} exceeds pool {pool.name}'s maxNodes "
                    f"{pool.max_nodes}; allowed: at most {pool.max_nodes}",
                )
            )
        if job.queue not in teams:
            problems.append(
                ((*loc, "queue"), f"{job.queue!r} is not a team queue; allowed: {', '.join(teams)}")
            )
        problems += [((*loc, "args"), message) for message in _job_args_errors(job)]
        if not storage[job.checkpoint]:
            problems.append(
                (
                    (*loc, "checkpoint"),
                    f"{job.checkpoint} is not enabled in storage; allowed: "
                    + ", ".join(k for k, on in storage.items() if on),
                )
            )
    return problems + _hybrid_errors(config) + dev_servers_errors(config)


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
    remote = config.hybrid.remote_node_cidrs + config.hybrid.remote_pod_cidrs
    for cidr in remote:
        if cidr.overlaps(config.network.cidr):
            problems.append(
                (
                    ("hybrid",),
                    f"{cidr} overlaps the VPC cidr {config.network.cidr}; allowed: "
                    "remote CIDRs outside the VPC",
                )
            )
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


def read_stack_file(stack: str, project_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """The `config:` map of Pulumi.<stack>.yaml, as the Pulumi CLI would pass it."""
    path = project_dir / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        stacks = sorted(
            p.name[len("Pulumi.") : -len(".yaml")] for p in project_dir.glob("Pulumi.*.yaml")
        )
        raise ConfigError(f"No stack file {path.name}; allowed stacks: {', '.join(stacks)}")
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"Invalid stack config in {path.name}: not YAML ({e})") from None
    config = document.get("config", {}) if isinstance(document, dict) else None
    if not isinstance(config, dict):
        raise ConfigError(f"Invalid stack config in {path.name}: `config` must be a mapping")
    return config


def load_stack_file(stack: str, project_dir: Path = PROJECT_DIR) -> StackConfig:
    return parse_stack_config(read_stack_file(stack, project_dir), f"Pulumi.{stack}.yaml")


def config_from_pulumi() -> StackConfig:
    """The running stack's config, read from the Pulumi runtime (real engine or mocks)."""
    from pulumi.runtime.config import CONFIG, get_config_env

    values = {**get_config_env(), **CONFIG.get()}
    source = f"Pulumi.{pulumi.get_stack()}.yaml"
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


def _key_path(loc: tuple) -> str:
    if loc[:1] == ("region",):
        return "aws:region"
    path = f"{NAMESPACE}:"
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path += f"[{part}]"
        elif not re.fullmatch(r"[\w.-]+", part):
            path += (
                f"[{json.dumps(part)}]"  # a key with spaces or control characters stays one line
            )
        else:
            path += part if i == 0 else f".{part}"
    return path


def _explain(err: dict) -> str:
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(err["loc"][:-1])
        return f"unknown key; allowed keys here: {', '.join(allowed)}"
    if err["type"] == "missing":
        return "missing; this key is required"
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] in {"model_type", "dict_type"}:
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
