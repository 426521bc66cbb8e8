"""`network`: the VPC the cluster lives in, created or adopted, and its VPC endpoints."""

import ipaddress
from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from infra.core.config import Cidr, Model, SubnetId, VpcId


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


class ExistingVpc(Model):
    """Adopt a VPC someone else owns: the program tags its subnets but creates none."""

    vpc_id: VpcId = Field(description="The VPC to adopt.")
    private_subnet_ids: list[SubnetId] = Field(
        min_length=2,
        max_length=6,
        description="Its private subnets, where nodes and pods live (tagged for Karpenter).",
    )
    public_subnet_ids: list[SubnetId] = Field(
        default_factory=list,
        max_length=6,
        description="Its public subnets, for load balancers and the hybrid gateway.",
    )

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


# EKS's smallest control-plane subnet (EKS user guide, "VPC and subnet requirements": at least
# 6 free addresses per subnet, 16 recommended; EKS places 2-4 network interfaces in them).
CONTROL_PLANE_PREFIX = 28

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
    """The VPC the cluster lives in: created over 2 or 3 AZs, or adopted (existingVpc)."""

    cidr: Cidr = Field(
        default="10.0.0.0/16",
        validate_default=True,
        description="The VPC's range, /16 to /20, not loopback, link-local, multicast or "
        "reserved (pods take VPC addresses: small VPCs run out).",
    )
    az_count: int = Field(default=2, ge=2, le=3, description="Availability zones the VPC spans.")
    nat_gateways: Literal["single", "perAz"] = Field(
        default="single",
        description="One NAT gateway for the VPC, or one per AZ (an AZ's failure then leaves the "
        "others their egress).",
    )
    private_subnet_cidrs: list[Cidr] | None = Field(
        default=None,
        min_length=1,
        description="Private subnets (nodes and pods), one per AZ, inside `cidr`, disjoint. "
        "Default: the first azCount eighths of `cidr`.",
    )
    public_subnet_cidrs: list[Cidr] | None = Field(
        default=None,
        min_length=1,
        description="Public subnets (NAT gateways, load balancers), one per AZ, inside `cidr`, "
        "disjoint. Default: /24s (or smaller) cut from the last eighth of `cidr`.",
    )
    control_plane_subnet_cidrs: list[Cidr] | None = Field(
        default=None,
        min_length=1,
        description="Subnets for the EKS control plane's network interfaces alone, one per AZ, "
        "/28 (EKS's smallest), inside `cidr`, disjoint: nothing else gets an address there, so "
        "NetworkPolicies can admit the API server's webhook calls by them without admitting "
        "pods. Default: the first free /28s of the last eighth of `cidr`.",
    )
    existing_vpc: ExistingVpc | None = Field(
        default=None,
        description="Adopt a VPC someone else owns instead of creating one: the program tags "
        "its subnets and creates none.",
    )
    vpc_endpoints: list[VpcEndpoint] = Field(
        default_factory=list,
        description="VPC endpoints in the private subnets, each once: `s3` is a gateway "
        "endpoint (no hourly charge); the others are interface endpoints, billed per AZ-hour. "
        "Not with existingVpc.",
    )

    @model_validator(mode="after")
    def _endpoints(self) -> "NetworkConfig":
        repeated = sorted({e for e in self.vpc_endpoints if self.vpc_endpoints.count(e) > 1})
        if repeated:
            raise ValueError(
                f"vpcEndpoints lists {', '.join(repeated)} more than once; allowed: each once"
            )
        if self.control_plane_subnet_cidrs and self.existing_vpc:
            raise ValueError(
                "controlPlaneSubnetCidrs is set with existingVpc; allowed: none in an adopted VPC "
                "(its cluster uses the adopted subnets)"
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
        control_plane = self.control_plane_cidrs()
        for key, subnets in (
            ("privateSubnetCidrs", private),
            ("publicSubnetCidrs", public),
            ("controlPlaneSubnetCidrs", control_plane),
        ):
            if len(subnets) != self.az_count:
                raise ValueError(
                    f"{key} has {len(subnets)} entries; allowed: one per AZ ({self.az_count})"
                )
            for subnet in subnets:
                if not subnet.subnet_of(self.cidr):
                    raise ValueError(f"{key}: {subnet} lies outside the VPC cidr {self.cidr}")
        for subnet in control_plane:
            if subnet.prefixlen > CONTROL_PLANE_PREFIX:
                raise ValueError(
                    f"controlPlaneSubnetCidrs: {subnet} is smaller than /{CONTROL_PLANE_PREFIX}; "
                    f"allowed: /{CONTROL_PLANE_PREFIX} or larger (EKS needs 6 free addresses in "
                    "each, and recommends 16)"
                )
        every = private + public + control_plane
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

    def control_plane_cidrs(self) -> list[ipaddress.IPv4Network]:
        """The control-plane subnets per AZ: explicit ones from config, else the first /28s of
        the last eighth that no private or public subnet takes (an empty list when there is no
        room: the validation names the key)."""
        if self.control_plane_subnet_cidrs:
            return list(self.control_plane_subnet_cidrs)
        taken = [n for subnets in self.subnet_cidrs() for n in subnets]
        last_eighth = list(self.cidr.subnets(prefixlen_diff=3))[-1]
        free = (
            block
            for block in last_eighth.subnets(new_prefix=CONTROL_PLANE_PREFIX)
            if not any(block.overlaps(t) for t in taken)
        )
        return [block for block, _ in zip(free, range(self.az_count), strict=False)]
