"""`hybrid`: machines outside AWS as EKS hybrid nodes, and the pool jobs name as `hybrid`."""

import datetime
import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    Field,
    model_validator,
)

from infra.core.config import (
    HYBRID_POOL,
    K8S_NAME,
    PATTERN_HINTS,
    Cidr,
    CpuInstanceType,
    K8sName,
    Model,
    retired,
)
from infra.core.pools import PoolCeiling, processes_per_node, smallest_room

# Address ranges EKS accepts for hybrid nodes' remote node and pod networks (RFC 1918, CGNAT).
HYBRID_ALLOWED_RANGES = [
    ipaddress.IPv4Network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
]


def _public_ipv4(value: Any) -> ipaddress.IPv4Address:
    try:
        address = ipaddress.IPv4Address(value)
    except (ValueError, TypeError):
        address = None
    # Not a network the machine's own router keeps to itself (RFC 1918, CGNAT) nor a special one.
    special = (
        address is None
        or any(address in r for r in HYBRID_ALLOWED_RANGES)
        or (address.is_loopback or address.is_link_local or address.is_multicast)
        or address.is_unspecified
    )
    if special:
        raise ValueError(
            f"{value!r} is not a public IPv4 address; allowed: the address the machine's "
            "packets leave its network with, e.g. 198.51.100.7, or none"
        )
    return address


def _ipv4_address(value: Any) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(value)
    except (ValueError, TypeError):
        raise ValueError(
            f"{value!r} is not an IPv4 address; allowed: a host address in remoteNodeCidrs[0], "
            "e.g. 10.200.0.2"
        ) from None


# Who a machine runs workloads for: a DevServer user (their servers) or a team (its jobs and its
# members' servers).
TENANT = rf"^(user|team):{K8S_NAME[1:-1]}$"
PATTERN_HINTS[TENANT] = (
    "user:<a devServers.users name> or team:<a queues.teams name>, e.g. user:alice"
)
Tenant = Annotated[str, Field(pattern=TENANT)]


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


UtcDate = Annotated[Any, AfterValidator(_utc_date)]


class HybridMachine(Model):
    """A machine outside AWS joining the cluster as an EKS hybrid node.

    Its owner is root on it and sees everything of the pods that run there (their files,
    processes, environment, and the Pod Identity credentials of their service accounts): it runs
    the workloads of `owner` and of those `allow` names, nobody else's.
    """

    name: K8sName = Field(description="The machine's name (its node's label and bootstrap page).")
    address: Annotated[Any, AfterValidator(_ipv4_address)] = Field(
        description="Its WireGuard address and node IP, for good: a host address of "
        "remoteNodeCidrs[0], not the gateway's (the first), not another machine's. The "
        "gateway's peer, the tunnel and the node's registration name it, so it never follows "
        "the machine's place in the list; best never reused."
    )
    gpus: int = Field(ge=0, le=16, description="Its GPUs (0: a CPU machine, gloo).")
    gpu_model: str = Field(
        default="", pattern=r"^[A-Za-z0-9 ._-]{0,40}$", description="A label, e.g. RTX 4090."
    )
    vcpu: int = Field(
        ge=1,
        le=512,
        description="What Kueue may admit onto it (with memoryGib and gpus) and what EKS bills "
        "per vCPU-hour: declare every hardware thread, as EKS counts them.",
    )
    memory_gib: int = Field(ge=1, le=8192, description="Its memory, GiB.")
    owner: Tenant = Field(
        description="Whose machine it is: user:<name> (a devServers.users name: their "
        "DevServers) or team:<name> (a queues.teams name: its jobs and its members' "
        "DevServers). It runs their workloads and, unless `allow` adds others, no one else's."
    )
    allow: list[Tenant] = Field(
        default_factory=list,
        max_length=50,
        description="Users and teams whose workloads it also runs (user:<name>, team:<name>); "
        "none by default. Its owner sees everything of them: allow only whom the owner may see.",
    )
    public_address: Annotated[Any, AfterValidator(_public_ipv4)] | None = Field(
        default=None,
        description="The public IPv4 address its WireGuard packets come from (its router's), "
        "if fixed. When every machine has one, the gateway admits WireGuard from those alone; "
        "otherwise from anywhere.",
    )
    ssm_activation_start: UtcDate | None = Field(
        default=None,
        description="The start day (YYYY-MM-DD, UTC) of this machine's own SSM activation; "
        "default ssmActivation.start. A new date gives this machine alone a new activation "
        "(a new code on its bootstrap page), e.g. to add it later or join it again.",
    )

    def tenants(self) -> tuple[str, ...]:
        return (self.owner, *self.allow)

    def admits(self, team: str, user: str | None = None) -> bool:
        """Whether it runs a workload of namespace of `team` (a team's namespace) or of `user`
        in `team` (the user's DevServer namespace)."""
        wanted = {f"team:{team}"} | ({f"user:{user}"} if user else set())
        return bool(wanted & set(self.tenants()))

    @model_validator(mode="before")
    @classmethod
    def _no_pod_cidr(cls, data: Any) -> Any:
        return retired(
            data,
            "podCidr",
            "Cilium's cluster-pool IPAM now gives each node its slice of remotePodCidrs when it "
            "joins (size: hybrid.podCidrMaskSize), and the gateway routes whatever slice it got",
        )


class SsmActivation(Model):
    """The machines' SSM hybrid activations: one per machine, admitting one registration, usable
    until 00:00 UTC `days` days after its start (the machine's ssmActivationStart, else `start`).

    One registration each, so an activation code joins one machine once, and nothing else: a
    leaked page registers no second node, and a machine that joins again needs a new date of its
    own. Registered machines keep working once theirs expires. Every argument of an activation is
    replace-on-change (terraform-provider-aws, which pulumi-aws bridges:
    internal/service/ssm/activation.go has no update, each argument is ForceNew), and each
    machine's activation is a resource of its own: adding, removing or re-dating one machine
    leaves every other machine's activation and page as they are. A new `start` (or `days`)
    re-dates every machine that has no date of its own.
    """

    start: UtcDate = Field(
        description="YYYY-MM-DD (UTC), the day of the pulumi up creating the activations; a new "
        "date replaces those of machines without a date of their own (new codes on their pages)."
    )
    days: int = Field(
        default=7,
        ge=1,
        le=30,
        description="Each expires at 00:00 UTC this many days after its start (SSM allows 30).",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_registration_limit(cls, data: Any) -> Any:
        return retired(
            data,
            "registrationLimit",
            "each machine has an activation of its own that admits one registration "
            "(machines[].ssmActivationStart gives one machine a new one)",
        )

    def expiration_date(self, start: datetime.date | None = None) -> str:
        """RFC 3339, as SSM's CreateActivation and the aws provider take it."""
        return f"{(start or self.start) + datetime.timedelta(days=self.days)}T00:00:00Z"


class HybridConfig(Model):
    """EKS Hybrid Nodes reached through a WireGuard gateway in a public subnet of the VPC.

    remoteNodeCidrs[0] is the WireGuard network: the gateway takes its first host address, each
    machine the address it declares (its node IP).
    """

    remote_node_cidrs: list[Cidr] = Field(
        min_length=1,
        max_length=15,
        description="The machines' node networks (RFC 1918 or CGNAT), not overlapping the VPC, "
        "the pod CIDRs or the service CIDR EKS picks; the first is the WireGuard network (the "
        "gateway takes its first host address).",
    )
    remote_pod_cidrs: list[Cidr] = Field(
        min_length=1,
        max_length=15,
        description="The machines' pod networks (RFC 1918 or CGNAT): Cilium gives each node a "
        "slice as it joins. AWS says not to change them once Cilium runs.",
    )
    credential_provider: Literal["ssm", "iam-roles-anywhere"] = Field(
        default="ssm",
        description="How the machines get AWS credentials: an SSM hybrid activation, or IAM "
        "Roles Anywhere with caBundlePem.",
    )
    ca_bundle_pem: str = Field(
        default="",
        description="PEM CA bundle that signs the machines' certificates (iam-roles-anywhere "
        "only).",
    )
    ssm_activation: SsmActivation | None = Field(
        default=None, description="The SSM hybrid activation (ssm only, required there)."
    )
    gateway_instance_type: CpuInstanceType = Field(
        default="c6i.large", description="The WireGuard gateway's EC2 instance type."
    )
    pod_cidr_mask_size: int = Field(
        default=24,
        ge=16,
        le=28,
        description="The prefix of each node's slice of remotePodCidrs (Cilium's "
        "clusterPoolIPv4MaskSize; /24 holds 254 pods), enough slices for every machine. A "
        "change applies to new slices only.",
    )
    machines: list[HybridMachine] = Field(
        min_length=1, max_length=100, description="The machines, names unique."
    )

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
        if self.ssm_activation is None:
            dated = [m.name for m in self.machines if m.ssm_activation_start is not None]
            if dated:
                raise ValueError(
                    f"machines {', '.join(dated)} set ssmActivationStart, which goes with "
                    "credentialProvider ssm; allowed: none for iam-roles-anywhere"
                )
        names = [m.name for m in self.machines]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"machine names {', '.join(repeated)} repeat; allowed: unique names")
        self._check_addresses()
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

    @property
    def gateway_address(self) -> ipaddress.IPv4Address:
        """The hub's address: the first host of the WireGuard network remoteNodeCidrs[0]."""
        return self.remote_node_cidrs[0].network_address + 1

    def _check_addresses(self) -> None:
        network, gateway = self.remote_node_cidrs[0], self.gateway_address
        first, last = gateway + 1, network.broadcast_address - 1
        allowed = (
            f"allowed: a host address of remoteNodeCidrs[0] {network} other than the gateway's "
            f"{gateway}, one per machine: {first} to {last}"
        )
        if network.prefixlen > 30:
            raise ValueError(
                f"remoteNodeCidrs[0] {network} has no room for the gateway and a machine; "
                "allowed: a /30 or wider (a /24 holds the gateway and 253 machines)"
            )
        taken: dict[ipaddress.IPv4Address, str] = {}
        for machine in self.machines:
            address, key = machine.address, f"machines[{machine.name}].address {machine.address}"
            if address not in network:
                raise ValueError(f"{key} is outside remoteNodeCidrs[0] {network}; {allowed}")
            if address == gateway:
                raise ValueError(f"{key} is the gateway's; {allowed}")
            if address in (network.network_address, network.broadcast_address):
                kind = "network" if address == network.network_address else "broadcast"
                raise ValueError(f"{key} is the {kind} address of {network}; {allowed}")
            if address in taken:
                raise ValueError(f"{key} is machine {taken[address]}'s too; {allowed}")
            taken[address] = machine.name

    def pool(
        self, nodes: int = 1, machines: tuple[HybridMachine, ...] | None = None
    ) -> "HybridPool":
        """All machines as one pool (the Kueue flavor's), or `machines` of them."""
        return HybridPool(tuple(self.machines) if machines is None else machines, nodes)

    def admitting(self, team: str, user: str | None = None) -> tuple[HybridMachine, ...]:
        """The machines that run workloads of `team`'s namespace, or of `user`'s (in `team`)."""
        return tuple(m for m in self.machines if m.admits(team, user))

    def activation_expiration(self, machine: HybridMachine) -> str:
        assert self.ssm_activation is not None
        return self.ssm_activation.expiration_date(machine.ssm_activation_start)


@dataclass(frozen=True)
class HybridPool:
    """Hybrid machines as the pool a job or DevServer flavor names with `nodePool: hybrid`: all
    of them (the Kueue flavor's quota), the ones that admit a job's team, or a flavor's machine.

    A job pod has a machine to itself, as on a GPU pool a node: a job of `nodes` pods is sized
    for the `nodes` largest of its machines (by GPUs, then vCPU, then memory), each pod asking
    for the GPUs and the pod room of the smallest of those, so that each of them holds one. Its
    pods go to these machines alone (infra/hybrid/placement.py).
    """

    machines: tuple[HybridMachine, ...]
    nodes: int = 1

    hybrid: ClassVar[bool] = True
    name: ClassVar[str] = HYBRID_POOL
    # What an EC2 pool may have and machines outside AWS have not.
    efa: ClassVar[bool] = False
    efa_network_cards: ClassVar[int] = 0
    topology: ClassVar[bool] = False

    @property
    def procs_per_node(self) -> int:
        return processes_per_node(self)

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
