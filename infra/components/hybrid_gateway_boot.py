"""What the WireGuard gateway of the hybrid nodes runs: its boot script and the peer sync it keeps.

The boot script (user data) holds only what never changes as machines come and go: the hub's
interface, the sync script and its timer. The peers live in SSM parameters, one per machine, which
`pulumi up` adds and removes; every 30 s the sync reads them, adds each node's pod CIDRs from the
cluster, and applies the result with `wg syncconf`, which leaves every unchanged peer's session as
it is (wg(8)). So adding a machine changes a parameter, never the instance.
"""

import ipaddress
import json
import shlex
import textwrap
from dataclasses import dataclass

INTERFACE = "wg0"
SYNC_SCRIPT = "/usr/local/sbin/hybrid-wireguard-peers"
SYNC_UNIT = "hybrid-wireguard-peers"
SYNC_SECONDS = 30
KEY_PLACEHOLDER = "@WIREGUARD_PRIVATE_KEY@"
# AL2023 ships WireGuard in the kernel but not its tools, nor iptables (the hub's PostUp uses
# it), nor jq (the sync's JSON); the AWS CLI and curl are there.
PACKAGES = ("wireguard-tools", "iptables-nft", "jq")


@dataclass(frozen=True)
class SyncTarget:
    """Where the sync finds the peers and the cluster whose nodes it routes pod CIDRs to."""

    region: str
    cluster: str
    peers_path: str  # SSM path; each parameter under it holds one wg(8) [Peer] section
    pod_cidrs: tuple[ipaddress.IPv4Network, ...]  # the remote pod CIDRs: the only ones routed


# Request and response shapes, as the sync reads them:
# - SSM GetParametersByPath (--output json): {"Parameters": [{"Name", "Value", ...}]}, every page
#   merged by the AWS CLI (API reference, GetParametersByPath).
# - EKS DescribeCluster: {"cluster": {"endpoint", "certificateAuthority": {"data": <base64 PEM>}}}
#   (API reference, DescribeCluster); `aws eks get-token` prints an ExecCredential whose
#   status.token is the bearer token (AWS CLI reference, eks get-token).
# - CiliumNodes: GET /apis/cilium.io/v2/ciliumnodes (group, version and plural of the CRD) is a
#   CiliumNodeList; each item's spec.addresses has the node's InternalIP (here its WireGuard
#   address, nodeadm's --node-ip) and spec.ipam.podCIDRs the slices the cluster-pool operator gave
#   it (cilium/cilium pkg/k8s/apis/cilium.io/client/crds/v2/ciliumnodes.yaml; AWS's own
#   aws/eks-hybrid-nodes-gateway reads the same two fields, internal/controller/node.go).
_SYNC_BODY = r"""work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umask 077

aws ssm get-parameters-by-path --region "$region" --path "$peers_path" --output json \
  | jq -r '.Parameters | sort_by(.Name) | .[].Value' > "$work/peers"

aws eks describe-cluster --region "$region" --name "$cluster" --output json > "$work/cluster"
jq -r .cluster.certificateAuthority.data "$work/cluster" | base64 -d > "$work/ca.crt"
token=$(aws eks get-token --region "$region" --cluster-name "$cluster" | jq -r .status.token)
printf 'Authorization: Bearer %s\n' "$token" > "$work/auth"
# Only slices inside the remote pod CIDRs: a node's CiliumNode cannot claim the VPC, say.
curl -fsS --max-time 20 --cacert "$work/ca.crt" -H @"$work/auth" \
  "$(jq -r .cluster.endpoint "$work/cluster")/apis/cilium.io/v2/ciliumnodes" \
  | jq -r --argjson pods "$pod_cidrs" '
      def addr: split(".") | map(tonumber) | .[0] * 16777216 + .[1] * 65536 + .[2] * 256 + .[3];
      def span: split("/") | (.[0] | addr) as $first
        | [$first, $first + pow(2; 32 - (.[1] | tonumber)) - 1];
      def inside($nets): span as [$first, $last]
        | any($nets[] | span; .[0] <= $first and $last <= .[1]);
      .items[]
      | ([.spec.addresses[]? | select(.type == "InternalIP") | .ip] | first) as $node
      | select($node != null)
      | .spec.ipam.podCIDRs[]? | select(inside($pods)) | "\($node) \(.)"' > "$work/routes"

# syncconf sets the interface to exactly this file: without its key and port it would drop both.
{
  printf '[Interface]\nPrivateKey = %s\nListenPort = %s\n\n' \
    "$(wg show "$interface" private-key)" "$(wg show "$interface" listen-port)"
  awk 'FILENAME == ARGV[1] { routes[$1] = routes[$1] ", " $2; next }
       { print }
       /^AllowedIPs = / {
         split($3, host, "/")
         if (host[1] in routes) print "AllowedIPs = " substr(routes[host[1]], 3)
       }' "$work/routes" "$work/peers"
} > "$work/peers.conf"
wg syncconf "$interface" "$work/peers.conf"
"""


def sync_script(target: SyncTarget) -> str:
    """Reloads the gateway's peers in place; the interface is its one argument.

    Any failure (SSM, the cluster, a malformed answer) stops it before `wg syncconf`: the
    interface keeps its last peers until the next run.
    """
    settings = {
        "region": target.region,
        "cluster": target.cluster,
        "peers_path": target.peers_path,
        "pod_cidrs": json.dumps([str(c) for c in target.pod_cidrs]),
    }
    header = [
        "#!/bin/bash",
        "# The hybrid nodes' WireGuard peers, reloaded in place: one [Peer] per machine from SSM,",
        "# each with the pod CIDRs Cilium gave its node, applied by `wg syncconf` (which keeps",
        "# every unchanged peer's session). Generated by infra/components/hybrid_gateway_boot.py.",
        "set -euo pipefail",
        "interface=$1",
        *(f"{key}={shlex.quote(value)}" for key, value in settings.items()),
    ]
    return "\n".join(header) + "\n" + _SYNC_BODY


def sync_units() -> dict[str, str]:
    """systemd unit file name -> text: the sync as a oneshot service, started every 30 s."""
    service = f"""\
        [Unit]
        Description=Reload the hybrid nodes' WireGuard peers in place
        Requires=wg-quick@{INTERFACE}.service
        After=wg-quick@{INTERFACE}.service

        [Service]
        Type=oneshot
        ExecStart={SYNC_SCRIPT} {INTERFACE}
        """
    timer = f"""\
        [Unit]
        Description=Reload the hybrid nodes' WireGuard peers every {SYNC_SECONDS} s

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


def user_data(region: str, key_parameter: str, hub_interface: str, target: SyncTarget) -> str:
    """The gateway's boot script: none of it depends on which machines exist.

    hub_interface is the hub's [Interface] with KEY_PLACEHOLDER for its private key, which is
    read from SSM here rather than written into user data, readable by anyone who may describe
    the instance.
    """
    files = [
        (SYNC_SCRIPT, "700", sync_script(target)),
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
        hub_interface.rstrip(),
        "WIREGUARD",
    ]
    for path, mode, text in files:
        lines += [f"install -m {mode} /dev/stdin {path} <<'FILE'", text.rstrip(), "FILE"]
    lines += [
        "systemctl daemon-reload",
        f"systemctl enable --now wg-quick@{INTERFACE} {SYNC_UNIT}.timer",
    ]
    return "\n".join(lines) + "\n"
