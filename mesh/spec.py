"""The mesh file: which machines train together, how to reach them, and their WireGuard layout.

Validated once at the edge; a bad file stops with one message per offending key path.
"""

import ipaddress
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

# Address ranges a mesh may use: private networks, and loopback for a single-machine rehearsal.
ALLOWED_NETWORKS = [
    ipaddress.IPv4Network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8")
]

Name = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")]
Port = Annotated[int, Field(ge=1, le=65535)]
Host = Annotated[str, Field(pattern=r"^[A-Za-z0-9]([A-Za-z0-9.:-]{0,252})$")]


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
    # WireGuard address in `network`; default: the network's host addresses in file order.
    address: ipaddress.IPv4Address | None = None
    # The host name or public IP spokes dial (the coordinator only).
    endpoint: Host | None = None
    python: str = "python3"  # the interpreter with torch and the training code
    workdir: str = "~"  # where the training script's relative paths start
    interface: str = Field(default="wg0", pattern=r"^[A-Za-z0-9_.-]{1,15}$")


class Mesh(Model):
    network: ipaddress.IPv4Network = ipaddress.IPv4Network("10.77.0.0/24")
    listen_port: Port = 51820  # the coordinator's WireGuard UDP port
    rendezvous_port: Port = 29400  # torchrun's c10d store on the coordinator
    coordinator: Name  # the WireGuard hub and the c10d rendezvous host; it trains too
    known_hosts: str | None = None  # extra known_hosts file; unknown host keys are refused
    nodes: list[Node] = Field(min_length=1, max_length=250)

    @model_validator(mode="after")
    def _consistent(self) -> "Mesh":
        if not any(self.network.subnet_of(n) for n in ALLOWED_NETWORKS):
            raise ValueError(
                f"network {self.network} is public; allowed: inside "
                + ", ".join(str(n) for n in ALLOWED_NETWORKS)
            )
        if self.network.prefixlen > 30:
            raise ValueError(f"network {self.network} is too small; allowed: /30 or larger")
        names = [n.name for n in self.nodes]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"node names {', '.join(repeated)} repeat; allowed: unique names")
        if self.coordinator not in names:
            raise ValueError(
                f"coordinator {self.coordinator!r} is not a node; allowed: {', '.join(names)}"
            )
        if self.node(self.coordinator).endpoint is None:
            raise ValueError(
                f"coordinator {self.coordinator!r} has no endpoint; allowed: the host name or "
                "public IP the other nodes reach it at (UDP listenPort open)"
            )
        capacity = self.network.num_addresses - 2  # less the network and broadcast addresses
        if len(self.nodes) > capacity:
            raise ValueError(f"{len(self.nodes)} nodes do not fit in {self.network}")
        for node in self.nodes:
            if node.address is not None and not self._is_host(node.address):
                raise ValueError(
                    f"node {node.name}: address {node.address} is not a host address of "
                    f"{self.network}"
                )
        addresses = [str(a) for a in self.addresses().values()]
        repeated = sorted({a for a in addresses if addresses.count(a) > 1})
        if repeated:
            raise ValueError(f"addresses {', '.join(repeated)} repeat; allowed: unique addresses")
        return self

    def _is_host(self, address: ipaddress.IPv4Address) -> bool:
        return address in self.network and address not in (
            self.network.network_address,
            self.network.broadcast_address,
        )

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def addresses(self) -> dict[str, ipaddress.IPv4Address]:
        """Each node's WireGuard address: its own, else the next free host address in order."""
        taken = {n.address for n in self.nodes if n.address is not None}
        free = (a for a in self.network.hosts() if a not in taken)
        return {n.name: n.address or next(free) for n in self.nodes}

    def rendezvous_endpoint(self) -> str:
        return f"{self.addresses()[self.coordinator]}:{self.rendezvous_port}"


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
