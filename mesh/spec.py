"""The mesh file: which machines train together, how to reach them, and the network between them.

The network is tp-mesh's own WireGuard (`network: 10.77.0.0/24`) or a tailnet the machines are
already on (`network: tailnet`: Tailscale or Headscale, nothing for tp-mesh to set up).
Validated once at the edge; a bad file stops with one message per offending key path.
"""

import ipaddress
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from mesh.wireguard import decode_key

# Address ranges a mesh may use: private networks, and loopback for a single-machine rehearsal.
ALLOWED_NETWORKS = [
    ipaddress.IPv4Network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8")
]
TAILNET = "tailnet"
# The ranges Tailscale assigns machines their addresses from (CGNATRange and TailscaleULARange in
# tailscale/tailscale net/tsaddr/tsaddr.go); Headscale's default prefixes are the same.
TAILNET_NETWORKS = (
    ipaddress.IPv4Network("100.64.0.0/10"),
    ipaddress.IPv6Network("fd7a:115c:a1e0::/48"),
)
# The interface torch's sockets use (GLOO/NCCL_SOCKET_IFNAME). tailscaled's default on Linux is
# tailscale0 (defaultTunName in tailscale/tailscale cmd/tailscaled/tailscaled.go); on macOS it
# takes the next free utunN, so a Mac sets its node's `interface` to the one `ifconfig` shows.
DEFAULT_INTERFACE = {"wireguard": "wg0", TAILNET: "tailscale0"}

Name = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")]
Port = Annotated[int, Field(ge=1, le=65535)]
Host = Annotated[str, Field(pattern=r"^[A-Za-z0-9]([A-Za-z0-9.:-]{0,252})$")]


def _wireguard_key(value: str) -> str:
    decode_key(value)
    return value


PublicKey = Annotated[str, AfterValidator(_wireguard_key)]


def _network(value: Any) -> ipaddress.IPv4Network | str:
    if value == TAILNET:
        return value
    try:
        return ipaddress.IPv4Network(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{value!r}: allowed: an IPv4 network for tp-mesh's WireGuard (10.77.0.0/24), "
            f"or {TAILNET} (the machines are on a Tailscale or Headscale tailnet)"
        ) from None


Network = Annotated[ipaddress.IPv4Network | Literal["tailnet"], PlainValidator(_network)]


class MeshError(Exception):
    """An invalid mesh file; the message names each key path and what is allowed."""


class Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, frozen=True, populate_by_name=True
    )


class Ssh(Model):
    host: Host
    port: Port = 22
    user: str | None = None  # default: the local user name, as ssh does
    key_file: str | None = None  # default: the SSH agent and ~/.ssh/id_*


class Node(Model):
    name: Name
    ssh: Ssh
    # WireGuard: its address in `network`, default the network's host addresses in file order.
    # Tailnet: its tailnet address (`tailscale ip` on it), required.
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    # WireGuard: the host name or public IP the other nodes dial (UDP listenPort reachable).
    # Nodes with one talk to each other directly; a node without one (behind NAT, no port
    # forward) talks to the coordinator only, which forwards for it.
    endpoint: Host | None = None
    # WireGuard: the public key `tp-mesh keygen` printed on this machine.
    public_key: PublicKey | None = None
    # WireGuard: where `tp-mesh keygen` wrote this machine's private key; it never leaves it.
    private_key_file: str | None = None  # default: /etc/wireguard/<interface>.key
    python: str = "python3"  # the interpreter with torch and the training code
    workdir: str = "~"  # where the training script's relative paths start
    interface: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,15}$")


class Mesh(Model):
    network: Network = ipaddress.IPv4Network("10.77.0.0/24")
    listen_port: Port = 51820  # every WireGuard node's UDP port
    rendezvous_port: Port = 29400  # torchrun's c10d store on the coordinator
    coordinator: Name  # the c10d rendezvous host (and the WireGuard hub); it trains too
    known_hosts: str | None = None  # extra known_hosts file; unknown host keys are refused
    nodes: list[Node] = Field(min_length=1, max_length=250)

    @property
    def on_tailnet(self) -> bool:
        return self.network == TAILNET

    @model_validator(mode="after")
    def _consistent(self) -> "Mesh":
        names = [n.name for n in self.nodes]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"node names {', '.join(repeated)} repeat; allowed: unique names")
        if self.coordinator not in names:
            raise ValueError(
                f"coordinator {self.coordinator!r} is not a node; allowed: {', '.join(names)}"
            )
        if self.on_tailnet:
            self._tailnet_nodes()
        else:
            self._wireguard_nodes()
        addresses = [str(a) for a in self.addresses().values()]
        repeated = sorted({a for a in addresses if addresses.count(a) > 1})
        if repeated:
            raise ValueError(f"addresses {', '.join(repeated)} repeat; allowed: unique addresses")
        return self

    def _tailnet_nodes(self) -> None:
        ranges = " or ".join(str(n) for n in TAILNET_NETWORKS)
        for node in self.nodes:
            if node.address is None or not any(node.address in n for n in TAILNET_NETWORKS):
                raise ValueError(
                    f"node {node.name}: address {node.address or '(none)'} is not a tailnet "
                    f"address; allowed: its address in {ranges} (`tailscale ip` on it)"
                )
            wireguard_only = ("endpoint", "public_key", "private_key_file")
            given = [to_camel(k) for k in wireguard_only if getattr(node, k) is not None]
            if given:
                raise ValueError(
                    f"node {node.name}: {', '.join(given)} set, but network is tailnet; "
                    "allowed: leave them out (they are for tp-mesh's own WireGuard)"
                )
        families = {n.address.version for n in self.nodes}
        if len(families) > 1:
            raise ValueError(
                "addresses mix IPv4 and IPv6; allowed: one family for every node (`tailscale "
                "ip -4` on each, or `tailscale ip -6` on each)"
            )

    def _wireguard_nodes(self) -> None:
        network = self.network
        if not any(network.subnet_of(n) for n in ALLOWED_NETWORKS):
            raise ValueError(
                f"network {network} is public; allowed: inside "
                + ", ".join(str(n) for n in ALLOWED_NETWORKS)
                + f", or {TAILNET}"
            )
        if network.prefixlen > 30:
            raise ValueError(f"network {network} is too small; allowed: /30 or larger")
        if self.node(self.coordinator).endpoint is None:
            raise ValueError(
                f"coordinator {self.coordinator!r} has no endpoint; allowed: the host name or "
                "public IP the other nodes reach it at (UDP listenPort open)"
            )
        capacity = network.num_addresses - 2  # less the network and broadcast addresses
        if len(self.nodes) > capacity:
            raise ValueError(f"{len(self.nodes)} nodes do not fit in {network}")
        for node in self.nodes:
            if node.address is not None and not (
                node.address in network
                and node.address not in (network.network_address, network.broadcast_address)
            ):
                raise ValueError(
                    f"node {node.name}: address {node.address} is not a host address of {network}"
                )
        keys = [n.public_key for n in self.nodes if n.public_key is not None]
        if len(set(keys)) < len(keys):
            holders = [n.name for n in self.nodes if keys.count(n.public_key) > 1]
            raise ValueError(
                f"nodes {', '.join(holders)} have the same publicKey; allowed: each machine's "
                "own (tp-mesh keygen on it)"
            )

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def addresses(self) -> dict[str, ipaddress.IPv4Address | ipaddress.IPv6Address]:
        """Each node's mesh address: its own, else the next free host address of the WireGuard
        network in order (a tailnet node always has its own)."""
        if self.on_tailnet:
            return {n.name: n.address for n in self.nodes}
        taken = {n.address for n in self.nodes if n.address is not None}
        free = (a for a in self.network.hosts() if a not in taken)
        return {n.name: n.address or next(free) for n in self.nodes}

    def interface(self, node: Node) -> str:
        return node.interface or DEFAULT_INTERFACE[TAILNET if self.on_tailnet else "wireguard"]

    def private_key_file(self, node: Node) -> str:
        return node.private_key_file or f"/etc/wireguard/{self.interface(node)}.key"

    def rendezvous_endpoint(self) -> str:
        address = self.addresses()[self.coordinator]
        host = f"[{address}]" if address.version == 6 else str(address)
        return f"{host}:{self.rendezvous_port}"


def load_mesh(path: Path) -> Mesh:
    try:
        document: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise MeshError(f"{path}: cannot read a YAML mesh file ({e})") from None
    try:
        return Mesh.model_validate(document)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"  {where}: {err['msg'].removeprefix('Value error, ')}")
        raise MeshError(f"Invalid mesh file {path}:\n" + "\n".join(lines)) from None
