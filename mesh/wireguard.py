"""WireGuard keys and hub-and-spoke configs, shared by light mode and the hybrid nodes gateway.

Keys are X25519, written as `wg genkey` / `wg pubkey` write them: 32 raw bytes, base64.
"""

import base64
import binascii
import ipaddress
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

KEY_BYTES = 32
# Spokes sit behind home routers: a keepalive holds the NAT mapping open so the hub can reach them.
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


def hub_interface(hub: Hub, network: ipaddress.IPv4Network) -> str:
    """The hub's [Interface] section, without peers: they follow as peer_section()s."""
    lines = [
        "# WireGuard hub; install as /etc/wireguard/wg0.conf, then: wg-quick up wg0",
        "[Interface]",
        f"Address = {hub.address}/{network.prefixlen}",
        f"ListenPort = {hub.listen_port}",
        f"PrivateKey = {hub.private_key}",
        # Spoke-to-spoke traffic (torchrun, NCCL/gloo) enters and leaves through the hub.
        "PostUp = sysctl -w net.ipv4.ip_forward=1",
        f"PostUp = iptables -A {FORWARD_BETWEEN_SPOKES}",
        f"PostDown = iptables -D {FORWARD_BETWEEN_SPOKES}",
    ]
    # wg-quick routes only the AllowedIPs of the peers it starts with; these come later.
    lines += [f"PostUp = ip route replace {net} dev %i" for net in hub.behind_spokes]
    return "\n".join(lines) + "\n"


def peer_section(spoke: Spoke) -> str:
    """A spoke as the hub's [Peer]: the hub sends it what is addressed to it."""
    return (
        "\n".join(
            [
                f"# {spoke.name}",
                "[Peer]",
                f"PublicKey = {public_key(spoke.private_key)}",
                f"AllowedIPs = {ipaddress.IPv4Network(spoke.address)}",
            ]
        )
        + "\n"
    )


def hub_config(hub: Hub, network: ipaddress.IPv4Network, spokes: list[Spoke]) -> str:
    return "\n".join([hub_interface(hub, network), *(peer_section(s) for s in spokes)])


def spoke_config(hub: Hub, network: ipaddress.IPv4Network, spoke: Spoke) -> str:
    allowed = ", ".join(str(n) for n in (network, *hub.routed))
    return (
        "\n".join(
            [
                f"# WireGuard spoke {spoke.name}; install as /etc/wireguard/wg0.conf, then: "
                "wg-quick up wg0",
                "[Interface]",
                f"Address = {spoke.address}/{network.prefixlen}",
                f"PrivateKey = {spoke.private_key}",
                "",
                "[Peer]",
                f"PublicKey = {public_key(hub.private_key)}",
                f"Endpoint = {hub.endpoint}:{hub.listen_port}",
                f"AllowedIPs = {allowed}",
                f"PersistentKeepalive = {KEEPALIVE_SECONDS}",
            ]
        )
        + "\n"
    )
