"""What the WireGuard gateway of the hybrid nodes runs: its interface and firewall, the sync it
keeps (infra/hybrid/gateway_sync.py) and the boot script that installs them.

The boot script (user data) holds only what never changes as machines come and go: the hub's
interface, its forwarding rules, the sync program and its timer. The machines live in SSM
parameters, one per machine, which `pulumi up` adds and removes; every 30 s the sync reads them
and applies the result with `wg syncconf`. So adding a machine changes a parameter, never the
instance.

The gateway forwards only what hybrid nodes need (EKS user guide, "Prepare networking for hybrid
nodes"), everything else is dropped (forward_rules): a machine owner is root on her machine and
may send anything into her tunnel, from the addresses WireGuard lets her peer use (its node
address and its pod CIDRs).
"""

import ipaddress
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

from infra.hybrid import gateway_sync as hybrid_gateway_sync

INTERFACE = "wg0"
SYNC_PROGRAM = "/usr/local/sbin/hybrid-wireguard-peers"
SYNC_SETTINGS = "/etc/hybrid-wireguard-peers.json"
FORWARD_SCRIPT = "/usr/local/sbin/hybrid-gateway-forward"
SYNC_UNIT = "hybrid-wireguard-peers"
SYNC_SECONDS = 30
KEY_PLACEHOLDER = "@WIREGUARD_PRIVATE_KEY@"
# AL2023 ships WireGuard in the kernel and python3 (the sync's), not WireGuard's tools nor
# iptables (the forwarding rules); the AWS CLI is there.
PACKAGES = ("wireguard-tools", "iptables-nft")
# The chain holding the forwarding rules; FORWARD jumps to it and drops what it does not accept.
CHAIN = "HYBRID-FORWARD"
INPUT_CHAIN = "HYBRID-INPUT"
# What crosses the gateway, besides replies (conntrack ESTABLISHED,RELATED: ICMP errors too):
# - between machines, node to node: Cilium's VXLAN tunnel, which carries their pods' traffic
#   (Cilium's default routing mode; its system requirements, "Firewall rules": UDP 8472), and
#   its health checks (TCP 4240 and ICMP echo);
MACHINE_TO_MACHINE = (("udp", 8472), ("tcp", 4240), ("icmp", None))
# - from the machines to the VPC: the API server's ENIs (TCP 443) and CoreDNS (53); pods on the
#   machines reach the VPC masqueraded to their node's address (AWS, "Configure CNI for hybrid
#   nodes": Cilium masquerades traffic leaving the cluster's pod CIDRs);
MACHINE_TO_VPC = (("tcp", 443), ("udp", 53), ("tcp", 53))
# - from the VPC to the machines: the control plane to the kubelets (TCP 10250: logs, exec,
#   port-forward), and the control plane (webhooks) and VPC pods (Prometheus) to the machines'
#   pods, over TCP.
VPC_TO_NODES = (("tcp", 10250),)
VPC_TO_PODS = (("tcp", None),)


@dataclass(frozen=True)
class GatewayNetworks:
    vpc: ipaddress.IPv4Network
    nodes: tuple[ipaddress.IPv4Network, ...]  # the remote node CIDRs
    pods: tuple[ipaddress.IPv4Network, ...]  # the remote pod CIDRs


@dataclass(frozen=True)
class SyncTarget:
    """Where the sync finds the machines and the cluster whose nodes it labels and routes."""

    region: str
    cluster: str
    peers_path: str  # SSM path; each parameter under it is one machine_parameter()
    pod_cidrs: tuple[ipaddress.IPv4Network, ...]  # the remote pod CIDRs: the only ones routed
    pool_label: str
    machine_label: str

    def settings(self) -> str:
        return json.dumps(
            {
                "region": self.region,
                "cluster": self.cluster,
                "peersPath": self.peers_path,
                "podCidrs": [str(c) for c in self.pod_cidrs],
                "poolLabel": self.pool_label,
                "machineLabel": self.machine_label,
            },
            indent=2,
        )


def _rule(where: str, sources, destinations, protocol: str, port: int | None) -> list[str]:
    match = "" if port is None else f" --dport {port}"
    if protocol == "icmp":
        match = " --icmp-type echo-request"
    return [
        f"iptables -A {CHAIN} {where} -s {source} -d {destination} -p {protocol}{match} -j ACCEPT"
        for source in sources
        for destination in destinations
    ]


def forward_rules(networks: GatewayNetworks) -> str:
    """A script, `up <interface>` or `down <interface>`, that sets the gateway's forwarding: the
    traffic of the module docstring's lists accepted, anything else dropped."""
    tunnel, out, into = '-i "$2" -o "$2"', '-i "$2" ! -o "$2"', '! -i "$2" -o "$2"'
    vpc = (networks.vpc,)
    rules = [
        f"iptables -A {CHAIN} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        *(r for p in MACHINE_TO_MACHINE for r in _rule(tunnel, networks.nodes, networks.nodes, *p)),
        *(r for p in MACHINE_TO_VPC for r in _rule(out, networks.nodes + networks.pods, vpc, *p)),
        *(r for p in VPC_TO_NODES for r in _rule(into, vpc, networks.nodes, *p)),
        *(r for p in VPC_TO_PODS for r in _rule(into, vpc, networks.pods, *p)),
        f"iptables -A {CHAIN} -j DROP",
    ]
    body = "\n".join(f"    {rule}" for rule in rules)
    # The script is part of the gateway's user data, which EC2 changes only by stopping and
    # starting the instance: its text names this module where it lived when gateways were first
    # deployed (infra/components/), so that moving the module restarts no gateway.
    return f"""#!/bin/bash
# The hybrid gateway's forwarding: what hybrid nodes need, nothing else. wg-quick runs it with
# `up %i` once the interface is up and `down %i` when it goes. Generated by
# infra/components/hybrid_gateway_boot.py.
set -euo pipefail
iptables -D FORWARD -j {CHAIN} 2>/dev/null || true
iptables -D INPUT -i "$2" -j {INPUT_CHAIN} 2>/dev/null || true
for chain in {CHAIN} {INPUT_CHAIN}; do
    iptables -F "$chain" 2>/dev/null || true
    iptables -X "$chain" 2>/dev/null || true
done
if [ "$1" = up ]; then
    iptables -N {CHAIN}
{body}
    iptables -A FORWARD -j {CHAIN}
    iptables -P FORWARD DROP
    # The gateway itself serves the machines nothing: replies and ping only.
    iptables -N {INPUT_CHAIN}
    iptables -A {INPUT_CHAIN} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
    iptables -A {INPUT_CHAIN} -p icmp --icmp-type echo-request -j ACCEPT
    iptables -A {INPUT_CHAIN} -j DROP
    iptables -A INPUT -i "$2" -j {INPUT_CHAIN}
    sysctl -qw net.ipv4.ip_forward=1
fi
"""


def gateway_interface(
    private_key: str,
    address: ipaddress.IPv4Address,
    network: ipaddress.IPv4Network,
    listen_port: int,
    pods: tuple[ipaddress.IPv4Network, ...],
) -> str:
    """The hub's [Interface] (its peers come from the sync): forwarding set up and torn down
    with it, and the pod CIDRs routed into the tunnel as a whole (wg-quick routes only the
    AllowedIPs of the peers it starts with; which peer holds which slice the sync says)."""
    lines = [
        "[Interface]",
        f"Address = {address}/{network.prefixlen}",
        f"ListenPort = {listen_port}",
        f"PrivateKey = {private_key}",
        f"PostUp = {FORWARD_SCRIPT} up %i",
        f"PostDown = {FORWARD_SCRIPT} down %i",
        *(f"PostUp = ip route replace {net} dev %i" for net in pods),
    ]
    return "\n".join(lines) + "\n"


def sync_program() -> str:
    return Path(hybrid_gateway_sync.__file__).read_text()


def sync_units() -> dict[str, str]:
    """systemd unit file name -> text: the sync as a oneshot service, started every 30 s."""
    service = f"""\
        [Unit]
        Description=Label the hybrid nodes and reload their WireGuard peers in place
        Requires=wg-quick@{INTERFACE}.service
        After=wg-quick@{INTERFACE}.service

        [Service]
        Type=oneshot
        ExecStart=/usr/bin/python3 {SYNC_PROGRAM} {SYNC_SETTINGS} {INTERFACE}
        """
    timer = f"""\
        [Unit]
        Description=Label the hybrid nodes and reload their WireGuard peers every {SYNC_SECONDS} s

        [Timer]
        OnActiveSec=0
        OnUnitActiveSec={SYNC_SECONDS}s
        # systemd.timer(5): AccuracySec defaults to 1min, which lets each 30 s run slip to 90 s.
        AccuracySec=1s

        [Install]
        WantedBy=timers.target
        """
    return {
        f"{SYNC_UNIT}.service": textwrap.dedent(service),
        f"{SYNC_UNIT}.timer": textwrap.dedent(timer),
    }


def user_data(
    region: str,
    key_parameter: str,
    interface: str,
    networks: GatewayNetworks,
    target: SyncTarget,
) -> str:
    """The gateway's boot script: none of it depends on which machines exist.

    `interface` is the hub's [Interface] with KEY_PLACEHOLDER for its private key, which is read
    from SSM here rather than written into user data, readable by anyone who may describe the
    instance.
    """
    files = [
        (FORWARD_SCRIPT, "700", forward_rules(networks)),
        (SYNC_PROGRAM, "700", sync_program()),
        (SYNC_SETTINGS, "600", target.settings()),
        *((f"/etc/systemd/system/{name}", "644", text) for name, text in sync_units().items()),
    ]
    lines = [
        "#!/bin/bash",
        "set -euo pipefail",
        f"dnf install -y {' '.join(PACKAGES)}",
        f"key=$(aws ssm get-parameter --region {region} --name {key_parameter} \\",
        "  --with-decryption --query Parameter.Value --output text)",
        "umask 077",
        f"sed \"s|{KEY_PLACEHOLDER}|$key|\" > /etc/wireguard/{INTERFACE}.conf <<'WIREGUARD'",
        interface.rstrip(),
        "WIREGUARD",
    ]
    for path, mode, text in files:
        lines += [f"install -m {mode} /dev/stdin {path} <<'FILE'", text.rstrip(), "FILE"]
    lines += [
        "systemctl daemon-reload",
        f"systemctl enable --now wg-quick@{INTERFACE} {SYNC_UNIT}.timer",
    ]
    return "\n".join(lines) + "\n"
