"""WireGuard keys and wg-quick config sections, shared by light mode (whose layout, a full mesh
with a hub for nodes behind NAT, is mesh/layout.py) and the hybrid nodes gateway (hub and spokes).

Keys are X25519, written as `wg genkey` / `wg pubkey` write them: 32 raw bytes, base64.
"""

import base64
import binascii
import ipaddress
import shlex
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

KEY_BYTES = 32
# Machines sit behind home routers: a keepalive holds the NAT mapping open so peers can reach them.
KEEPALIVE_SECONDS = 25


def generate_private_key() -> str:
    raw = X25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    return base64.b64encode(raw).decode()


def decode_key(key: str) -> bytes:
    """The raw key, or ValueError saying what a WireGuard key looks like."""
    try:
        raw = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != KEY_BYTES:
        raise ValueError("not a WireGuard key; allowed: 32 bytes in base64 (44 characters)")
    return raw


def public_key(private_key: str) -> str:
    private = X25519PrivateKey.from_private_bytes(decode_key(private_key))
    raw = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return base64.b64encode(raw).decode()


@dataclass(frozen=True)
class Peer:
    """One [Peer] section: the peer's key, the addresses it sends from and is sent, where it is."""

    public_key: str
    allowed_ips: tuple[ipaddress.IPv4Network, ...]
    endpoint: str | None = None  # host:port; without one, the peer's first handshake sets it
    keepalive: bool = False
    name: str | None = None  # written as a comment above the section


def peer_text(peer: Peer) -> str:
    lines = [f"# {peer.name}"] if peer.name else []
    lines += ["[Peer]", f"PublicKey = {peer.public_key}"]
    if peer.endpoint:
        lines.append(f"Endpoint = {peer.endpoint}")
    lines.append(f"AllowedIPs = {', '.join(str(n) for n in peer.allowed_ips)}")
    if peer.keepalive:
        lines.append(f"PersistentKeepalive = {KEEPALIVE_SECONDS}")
    return "\n".join(lines) + "\n"


def interface_lines(
    address: ipaddress.IPv4Address,
    network: ipaddress.IPv4Network,
    listen_port: int | None = None,
    private_key: str | None = None,
) -> list[str]:
    """The [Interface] section's head; without private_key, a PostUp sets it (key_file_post_up)."""
    lines = ["[Interface]", f"Address = {address}/{network.prefixlen}"]
    if listen_port is not None:
        lines.append(f"ListenPort = {listen_port}")
    if private_key is not None:
        lines.append(f"PrivateKey = {private_key}")
    return lines


def key_file_post_up(key_file: str, keepalive_peers: list[str]) -> str:
    """wg-quick(8)'s way to keep the private key out of the config (its EXAMPLES: `PostUp = wg
    set %i private-key <file>`), run once the interface is up.

    WireGuard sends a persistent-keepalive peer its first handshake when the interface comes up
    or when keepalive is switched on, and cannot without a private key; so keepalive is switched
    on here, after the key, rather than in [Peer]. Otherwise a node behind NAT stays unreachable
    until it sends something or a handshake retry (5 s in wireguard-go) goes out.
    """
    peers = "".join(
        f" peer {key} persistent-keepalive {KEEPALIVE_SECONDS}" for key in keepalive_peers
    )
    return f"PostUp = wg set %i private-key {shlex.quote(key_file)}{peers}"


@dataclass(frozen=True)
class Spoke:
    name: str
    private_key: str
    address: ipaddress.IPv4Address


@dataclass(frozen=True)
class Hub:
    private_key: str
    address: ipaddress.IPv4Address
    endpoint: str  # host name or public IP the spokes dial
    listen_port: int
    # Networks the spokes reach through the hub, besides the mesh itself (hybrid: the VPC).
    routed: tuple[ipaddress.IPv4Network, ...] = ()
    # Networks behind the spokes, routed into the tunnel as a whole: which spoke holds which part
    # its peer's AllowedIPs say, set as the parts are handed out (hybrid: the remote pod CIDRs,
    # sliced per node by Cilium, see infra/components/hybrid_nodes.py).
    behind_spokes: tuple[ipaddress.IPv4Network, ...] = ()


# wg-quick(8) runs each PostUp/PostDown line with bash once the interface is up (or gone), %i
# standing for the interface. Docker and ufw leave the FORWARD policy at DROP, which would stop
# every packet between two spokes at the hub: accept those (in on the tunnel, out on it again),
# and nothing else, so the hub forwards no traffic between the mesh and its other networks.
FORWARD_BETWEEN_SPOKES = "FORWARD -i %i -o %i -j ACCEPT"


def forwarding_lines() -> list[str]:
    """The hub's PostUp/PostDown: traffic between its peers enters and leaves through it."""
    return [
        "PostUp = sysctl -w net.ipv4.ip_forward=1",
        f"PostUp = iptables -A {FORWARD_BETWEEN_SPOKES}",
        f"PostDown = iptables -D {FORWARD_BETWEEN_SPOKES}",
    ]


def hub_interface(hub: Hub, network: ipaddress.IPv4Network) -> str:
    """The hub's [Interface] section, without peers: they follow as peer_section()s."""
    lines = [
        "# WireGuard hub; install as /etc/wireguard/wg0.conf, then: wg-quick up wg0",
        *interface_lines(hub.address, network, hub.listen_port, hub.private_key),
        *forwarding_lines(),
    ]
    # wg-quick routes only the AllowedIPs of the peers it starts with; these come later.
    lines += [f"PostUp = ip route replace {net} dev %i" for net in hub.behind_spokes]
    return "\n".join(lines) + "\n"


def peer_section(spoke: Spoke) -> str:
    """A spoke as the hub's [Peer]: the hub sends it what is addressed to it."""
    return peer_text(
        Peer(
            public_key(spoke.private_key),
            (ipaddress.IPv4Network(spoke.address),),
            name=spoke.name,
        )
    )


def spoke_config(hub: Hub, network: ipaddress.IPv4Network, spoke: Spoke) -> str:
    through_hub = Peer(
        public_key(hub.private_key),
        (network, *hub.routed),
        endpoint=f"{hub.endpoint}:{hub.listen_port}",
        keepalive=True,
    )
    head = [
        f"# WireGuard spoke {spoke.name}; install as /etc/wireguard/wg0.conf, then: "
        "wg-quick up wg0",
        *interface_lines(spoke.address, network, private_key=spoke.private_key),
    ]
    return "\n".join([*head, "", peer_text(through_hub)])
