"""The hybrid nodes' gateway sync: the program the WireGuard gateway runs every 30 s (installed by
hybrid_gateway_boot.py), Python 3.9 (AL2023's python3) and its standard library only.

Each run it
1. reads the machines from SSM, one parameter each under the peers path (machine_parameter): a
   name, a WireGuard public key and address, and how its node is known: the ID of its SSM
   activation (which admits one registration, so its one managed instance mi-<id> is the node's
   name) or, with IAM Roles Anywhere, the machine's name itself (its certificate's CN, which the
   role's trust policy makes the session name, and EKS makes the node name);
2. finds each machine's node: the managed instance SSM registered through its activation;
3. labels each machine's node with POOL_LABEL=hybrid and MACHINE_LABEL=<machine>, and takes
   them off any node that is not one (a machine removed from the stack, a node registered
   anew): labels no kubelet may set, so only a node the platform matched to a machine by its
   credentials is where pods of that machine go;
4. routes each node's pod CIDRs to its machine's peer: a CiliumNode's ranges count only if the
   CiliumNode is a machine's node, they lie inside the remote pod CIDRs, and no other CiliumNode
   claims any part of them (a Cilium agent may write any CiliumNode; the CiliumNode admission
   policy keeps pod CIDRs the Cilium operator's alone, and this keeps a forged claim from
   taking another machine's pods even without it);
5. applies the peers with `wg syncconf`, which leaves every unchanged peer's session as it is.

Any failure (SSM, the cluster, a malformed answer) stops it before `wg syncconf`: the interface
keeps its last peers until the next run.

Request and response shapes, as it reads them:
- SSM GetParametersByPath: {"Parameters": [{"Name", "Value", ...}]}, pages merged by the AWS CLI.
- SSM DescribeInstanceInformation (filter ActivationIds): {"InstanceInformationList":
  [{"InstanceId", "ActivationId", ...}]} (API reference, InstanceInformation).
- EKS DescribeCluster: {"cluster": {"endpoint", "certificateAuthority": {"data": <base64 PEM>}}};
  `aws eks get-token` prints an ExecCredential whose status.token is the bearer token.
- GET /api/v1/nodes: a NodeList; PATCH /api/v1/nodes/<name> with a JSON merge patch (RFC 7386:
  a null value removes a label).
- GET /apis/cilium.io/v2/ciliumnodes: a CiliumNodeList; each item is named after its node, with
  the slices the cluster-pool operator gave it in spec.ipam.podCIDRs (cilium/cilium
  pkg/k8s/apis/cilium.io/client/crds/v2/ciliumnodes.yaml).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import tempfile
import urllib.request

HYBRID_POOL = "hybrid"


def machine_parameter(machine: str, public_key: str, address: str, activation: str | None) -> str:
    """A machine as its SSM parameter holds it (public: a key and an address, no secret)."""
    known_by = {"activation": activation} if activation else {"node": machine}
    return json.dumps(
        {"machine": machine, "publicKey": public_key, "address": address, **known_by},
        sort_keys=True,
    )


def aws(*args: str) -> dict:
    done = subprocess.run(["aws", *args, "--output", "json"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"aws {' '.join(args[:2])} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


class Cluster:
    """The Kubernetes API of the cluster, as the gateway's IAM role (its access entry's group)."""

    def __init__(self, region: str, name: str):
        found = aws("eks", "describe-cluster", "--region", region, "--name", name)["cluster"]
        credential = aws("eks", "get-token", "--region", region, "--cluster-name", name)
        self.endpoint = found["endpoint"]
        self.token = credential["status"]["token"]
        ca = base64.b64decode(found["certificateAuthority"]["data"]).decode()
        self.context = ssl.create_default_context(cadata=ca)

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            self.endpoint + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/merge-patch+json",
                "Accept": "application/json",
            },
        )
        with urllib.request.urlopen(request, context=self.context, timeout=20) as response:
            return json.load(response)


def machine_nodes(machines: list[dict], region: str) -> dict[str, str]:
    """Node name -> machine: the managed instance each machine's activation registered, or
    the machine's own name (IAM Roles Anywhere)."""
    nodes = {m["node"]: m["machine"] for m in machines if "node" in m}
    by_activation = {m["activation"]: m["machine"] for m in machines if "activation" in m}
    if by_activation:
        found = aws(
            "ssm",
            "describe-instance-information",
            "--region",
            region,
            "--filters",
            f"Key=ActivationIds,Values={','.join(sorted(by_activation))}",
        )
        for instance in found["InstanceInformationList"]:
            if instance.get("ActivationId") in by_activation:
                nodes[instance["InstanceId"]] = by_activation[instance["ActivationId"]]
    return nodes


def label_patches(
    nodes: list[dict], machine_of: dict[str, str], pool_label: str, machine_label: str
) -> dict[str, dict]:
    """Node name -> the labels to set (None: remove) so that exactly the machines' nodes carry
    POOL_LABEL=hybrid and their machine's MACHINE_LABEL. Other pools' POOL_LABEL stays."""
    patches = {}
    for node in nodes:
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        machine = machine_of.get(name)
        wanted = {machine_label: machine}
        if machine is not None or labels.get(pool_label) == HYBRID_POOL:
            wanted[pool_label] = HYBRID_POOL if machine is not None else None
        patch = {k: v for k, v in wanted.items() if labels.get(k) != v}
        if patch:
            patches[name] = patch
    return patches


def pod_routes(
    cilium_nodes: list[dict], machine_of: dict[str, str], pod_cidrs: list[str]
) -> dict[str, list[str]]:
    """Machine -> the pod CIDRs routed to it: its node's, inside the remote pod CIDRs, and
    claimed by no other CiliumNode (overlap included)."""
    pods = [ipaddress.ip_network(c) for c in pod_cidrs]
    claims = []
    for item in cilium_nodes:
        name = item["metadata"]["name"]
        for cidr in ((item.get("spec") or {}).get("ipam") or {}).get("podCIDRs") or []:
            try:
                network = ipaddress.ip_network(cidr)
            except ValueError:
                continue
            if network.version == 4 and any(network.subnet_of(p) for p in pods):
                claims.append((name, network))
    routes: dict[str, list[str]] = {}
    for name, network in claims:
        contested = any(o != name and network.overlaps(n) for o, n in claims)
        if name in machine_of and not contested:
            routes.setdefault(machine_of[name], []).append(str(network))
    return routes


def peers_config(
    machines: list[dict], routes: dict[str, list[str]], private_key: str, port: str
) -> str:
    """The interface as `wg syncconf` takes it: its key and port (without them it would drop
    both), and a peer per machine, reaching its address and its node's pod CIDRs."""
    lines = ["[Interface]", f"PrivateKey = {private_key}", f"ListenPort = {port}", ""]
    for machine in sorted(machines, key=lambda m: m["machine"]):
        allowed = [f"{machine['address']}/32", *sorted(routes.get(machine["machine"], []))]
        lines += [
            f"# {machine['machine']}",
            "[Peer]",
            f"PublicKey = {machine['publicKey']}",
            f"AllowedIPs = {', '.join(allowed)}",
            "",
        ]
    return "\n".join(lines)


def wg(*args: str) -> str:
    return subprocess.run(["wg", *args], capture_output=True, text=True, check=True).stdout.strip()


def main(argv: list[str]) -> None:
    settings_file, interface = argv[1:3]
    with open(settings_file) as f:
        settings = json.load(f)
    region = settings["region"]
    parameters = aws(
        "ssm", "get-parameters-by-path", "--region", region, "--path", settings["peersPath"]
    )["Parameters"]
    machines = [json.loads(p["Value"]) for p in sorted(parameters, key=lambda p: p["Name"])]
    machine_of = machine_nodes(machines, region)
    cluster = Cluster(region, settings["cluster"])
    nodes = cluster.call("GET", "/api/v1/nodes")["items"]
    patches = label_patches(nodes, machine_of, settings["poolLabel"], settings["machineLabel"])
    for name, labels in sorted(patches.items()):
        cluster.call("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": labels}})
    cilium_nodes = cluster.call("GET", "/apis/cilium.io/v2/ciliumnodes")["items"]
    routes = pod_routes(cilium_nodes, machine_of, settings["podCidrs"])
    config = peers_config(
        machines, routes, wg("show", interface, "private-key"), wg("show", interface, "listen-port")
    )
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "peers.conf")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(config)
        wg("syncconf", interface, path)


if __name__ == "__main__":
    main(sys.argv)
