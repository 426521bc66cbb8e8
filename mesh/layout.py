"""Who peers with whom on tp-mesh's own WireGuard, as one wg-quick config per node.

Nodes with an endpoint (a public address with the UDP port open) form a full mesh: each has a
[Peer] for each of the others, so their traffic goes straight between them. A node without one
(behind NAT, no port forward) cannot be dialled: it has the coordinator as its only peer, for the
whole network, and the coordinator forwards for it. The other nodes reach it through the
coordinator too: its address is in their coordinator peer's AllowedIPs and in no other peer's,
since WireGuard sends each packet to the one peer whose AllowedIPs hold the destination.

No private key is in any config: each machine keeps its own (`tp-mesh keygen` on it), and its
config reads it from there on `wg-quick up`.
"""

import ipaddress

from mesh.spec import Mesh, MeshError, Node
from mesh.wireguard import (
    Peer,
    forwarding_lines,
    interface_lines,
    key_file_post_up,
    peer_text,
)


def wireguard_configs(mesh: Mesh) -> dict[str, str]:
    """node name -> its wg-quick config."""
    missing = [n.name for n in mesh.nodes if n.public_key is None]
    if missing:
        raise MeshError(
            f"nodes {', '.join(missing)} have no publicKey: each machine makes its own key. On "
            "each of them run `tp-mesh keygen` (it writes /etc/wireguard/wg0.key and prints the "
            "public key) and add the key to its node in the mesh file as publicKey. Private "
            "keys an older tp-mesh wrote under build/mesh/keys are no longer used: delete them."
        )
    return {node.name: _config(mesh, node, _peers(mesh, node)) for node in mesh.nodes}


def _peers(mesh: Mesh, node: Node) -> list[Peer]:
    addresses = mesh.addresses()

    def peer(other: Node, allowed: tuple[ipaddress.IPv4Network, ...] = ()) -> Peer:
        return Peer(
            public_key=other.public_key,
            allowed_ips=allowed or (ipaddress.IPv4Network(addresses[other.name]),),
            endpoint=f"{other.endpoint}:{mesh.listen_port}" if other.endpoint else None,
            name=other.name,
        )

    hub = mesh.node(mesh.coordinator)
    others = [n for n in mesh.nodes if n is not node]
    if node is hub:
        return [peer(n) for n in others]
    if node.endpoint is None:
        return [peer(hub, allowed=(mesh.network,))]
    behind_hub = [ipaddress.IPv4Network(addresses[n.name]) for n in others if n.endpoint is None]
    return [peer(hub, allowed=(ipaddress.IPv4Network(addresses[hub.name]), *behind_hub))] + [
        peer(n) for n in others if n is not hub and n.endpoint is not None
    ]


def _config(mesh: Mesh, node: Node, peers: list[Peer]) -> str:
    interface = mesh.interface(node)
    if node.name == mesh.coordinator:
        role = "the coordinator: every node's peer, forwarding for nodes without an endpoint"
    elif node.endpoint is None:
        role = "no endpoint: reaches every node through the coordinator"
    else:
        role = "reaches every node with an endpoint directly"
    head = [
        f"# tp-mesh node {node.name}, {role}.",
        f"# Install as /etc/wireguard/{interface}.conf, then: wg-quick up {interface}",
        *interface_lines(
            mesh.addresses()[node.name],
            mesh.network,
            listen_port=mesh.listen_port if node.endpoint else None,
        ),
        "# This machine's own private key, then keepalive to the peers with an endpoint.",
        key_file_post_up(
            mesh.private_key_file(node), [p.public_key for p in peers if p.endpoint is not None]
        ),
        *(forwarding_lines() if node.name == mesh.coordinator else []),
    ]
    return "\n".join([*head, "", *(peer_text(p) for p in peers)])
