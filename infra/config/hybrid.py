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

from infra.config.base import HYBRID_POOL, Cidr, CpuInstanceType, K8sName, Model
from infra.config.pools import NodePoolConfig, PoolCeiling, smallest_room

# Address ranges EKS accepts for hybrid nodes' remote node and pod networks (RFC 1918, CGNAT).
HYBRID_ALLOWED_RANGES = [
    ipaddress.IPv4Network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
]


def _ipv4_address(value: Any) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(value)
    except (ValueError, TypeError):
        raise ValueError(
            f"{value!r} is not an IPv4 address; allowed: a host address in remoteNodeCidrs[0], "
            "e.g. 10.200.0.2"
        ) from None


class HybridMachine(Model):
    """A machine outside AWS joining the cluster as an EKS hybrid node."""

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
    """The machines' SSM hybrid activation: usable until 00:00 UTC `days` days after `start`, for
    at most `registrationLimit` registrations.

    Registered machines keep working once it expires; only a machine that joins later needs a
    live one. Setting a new `start` and running `pulumi up` replaces it with a fresh one. Every
    argument of an activation is replace-on-change (terraform-provider-aws, which pulumi-aws
    bridges: internal/service/ssm/activation.go has no update, each argument is ForceNew), and a
    new one gives every bootstrap page a new code: so the limit is a ceiling of its own, not the
    number of machines, and adding or removing a machine leaves the activation as it is.
    """

    start: Annotated[Any, AfterValidator(_utc_date)] = Field(
        description="YYYY-MM-DD (UTC), the day of the pulumi up creating it; a new date "
        "replaces the activation (every bootstrap page gets a new code)."
    )
    days: int = Field(
        default=7,
        ge=1,
        le=30,
        description="It expires at 00:00 UTC this many days after start (SSM allows 30).",
    )
    registration_limit: int = Field(
        default=10,
        ge=1,
        le=1000,
        description="Registrations it admits, at least the number of machines; each counts, a "
        "machine registering again too. A new limit replaces the activation.",
    )

    def expiration_date(self) -> str:
        """RFC 3339, as SSM's CreateActivation and the aws provider take it."""
        return f"{self.start + datetime.timedelta(days=self.days)}T00:00:00Z"


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
        activation = self.ssm_activation
        if activation is not None and activation.registration_limit < len(self.machines):
            raise ValueError(
                f"ssmActivation.registrationLimit {activation.registration_limit} admits fewer "
                f"registrations than the {len(self.machines)} machines need; allowed: at least "
                f"{len(self.machines)} (a new limit replaces the activation: every bootstrap "
                "page gets a new code, registered machines keep working)"
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
