"""The hybrid nodes' WireGuard gateway, run for real against wireguard-go in network namespaces:
the gateway, two machines on an underlay bridge and a VPC host behind the gateway. Its
generated forwarding rules pass what hybrid nodes need and drop the rest; its sync program (the
file the gateway runs) reloads the peers in place, labels the machines' nodes and routes each
node's pod CIDRs to its machine alone, whatever a CiliumNode claims. Only what the gateway asks
of AWS is stubbed, at the AWS CLI: a fake `aws` on PATH prints what the real one prints for those
calls. The cluster's Nodes and CiliumNodes come from a local HTTPS server shaped like the
Kubernetes API, since no API server runs here."""

import base64
import datetime
import ipaddress
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from infra.core.nodes import MACHINE_LABEL, POOL_LABEL
from infra.hybrid.gateway_boot import (
    FORWARD_SCRIPT,
    KEY_PLACEHOLDER,
    SYNC_SECONDS,
    SYNC_UNIT,
    GatewayNetworks,
    SyncTarget,
    forward_rules,
    gateway_interface,
    sync_program,
    sync_units,
)
from infra.hybrid.gateway_sync import machine_parameter
from mesh.wireguard import Hub, Spoke, generate_private_key, public_key, spoke_config
from tests.netns import Namespaces, stop

NETWORK = ipaddress.IPv4Network("10.200.0.0/24")
PODS = ipaddress.IPv4Network("10.201.0.0/16")
VPC = ipaddress.IPv4Network("10.20.0.0/16")
PEERS_PATH = "/training-platform/test/hybrid-wireguard-peers"
TARGET = SyncTarget("us-west-2", "tp-test", PEERS_PATH, (PODS,), POOL_LABEL, MACHINE_LABEL)
TOKEN = "k8s-aws-v1.offline-token"
ACTIVATIONS = {
    "alice-4090": "11111111-aaaa-4aaa-8aaa-111111111111",
    "bob-cpu": "22222222-bbbb-4bbb-8bbb-222222222222",
}

# The AWS CLI for the four calls the sync makes, printing what the real one prints (response
# shapes in infra/hybrid/gateway_sync.py); any other call fails loudly.
FAKE_AWS = """#!{python}
import json, os, sys
state = json.load(open(os.environ["FAKE_AWS_STATE"]))
args = sys.argv[1:]
calls = {{
    ("ssm", "get-parameters-by-path", "--region", "{region}", "--path", "{path}",
     "--output", "json"): {{
        "Parameters": [
            {{"Name": name, "Type": "String", "Value": value, "Version": 1}}
            for name, value in state["parameters"].items()
        ]
    }},
    ("eks", "describe-cluster", "--region", "{region}", "--name", "{cluster}", "--output",
     "json"): {{
        "cluster": {{
            "name": "{cluster}",
            "endpoint": state["endpoint"],
            "certificateAuthority": {{"data": state["ca"]}},
        }}
    }},
    ("eks", "get-token", "--region", "{region}", "--cluster-name", "{cluster}", "--output",
     "json"): {{
        "kind": "ExecCredential",
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "spec": {{}},
        "status": {{"expirationTimestamp": "2026-11-24T12:14:00Z", "token": "{token}"}},
    }},
}}
if args[:4] == ["ssm", "describe-instance-information", "--region", "{region}"]:
    asked = args[args.index("--filters") + 1].removeprefix("Key=ActivationIds,Values=")
    print(json.dumps({{"InstanceInformationList": [
        {{"InstanceId": i, "ActivationId": a, "PingStatus": "Online",
          "ResourceType": "ManagedInstance"}}
        for a, i in state["instances"].items() if a in asked.split(",")
    ]}}))
    sys.exit(0)
if tuple(args) not in calls:
    sys.exit(f"fake aws: unexpected call {{args}}")
print(json.dumps(calls[tuple(args)], indent=4))
"""

# The cluster as the API server answers the gateway's role: NodeLists and CiliumNodeLists, and
# JSON merge patches of a Node's labels (RFC 7386: null removes), recorded; for the bearer token
# only. The objects are the test's, read on every request.
FAKE_API = """
import http.server, json, ssl, sys
state, cert, key, port_file = sys.argv[1:]

class Api(http.server.BaseHTTPRequestHandler):
    def reply(self, body):
        body = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        current = json.load(open(state))
        if self.headers.get("Authorization") != "Bearer {token}":
            return self.send_error(401)
        if current.get("fail"):
            return self.send_error(500)
        lists = {{"/api/v1/nodes": ("v1", "NodeList", "nodes"),
                  "/apis/cilium.io/v2/ciliumnodes": ("cilium.io/v2", "CiliumNodeList",
                                                      "ciliumnodes")}}
        if self.path not in lists:
            return self.send_error(404)
        version, kind, items = lists[self.path]
        self.reply({{"apiVersion": version, "kind": kind, "metadata": {{"resourceVersion": "1"}},
                    "items": current[items]}})

    def do_PATCH(self):
        current = json.load(open(state))
        if self.headers.get("Authorization") != "Bearer {token}":
            return self.send_error(401)
        if self.headers.get("Content-Type") != "application/merge-patch+json":
            return self.send_error(415)
        name = self.path.removeprefix("/api/v1/nodes/")
        patch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        (node,) = [n for n in current["nodes"] if n["metadata"]["name"] == name]
        labels = node["metadata"].setdefault("labels", {{}})
        for key, value in patch["metadata"]["labels"].items():
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
        current.setdefault("patches", []).append([name, patch])
        json.dump(current, open(state, "w"))
        self.reply(node)

    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("127.0.0.1", 0), Api)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
open(port_file, "w").write(str(server.server_address[1]))
try:
    server.serve_forever()
except KeyboardInterrupt:  # how the test stops it
    pass
"""

# Listens on TCP ports and answers each connection with the port it came to; says "listening"
# once every port is bound, so that a refused connection proves a rule, not a late start.
LISTENER = """
import socket, sys, threading
def serve(server, port):
    while True:
        connection, _ = server.accept()
        connection.sendall(str(port).encode())
        connection.close()
for port in sys.argv[1:]:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", int(port)))
    server.listen()
    threading.Thread(target=serve, args=(server, port), daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
"""
# A connection that is answered by the port it went to. Forwarded through wireguard-go on a
# loaded machine an answer can take a while: the timeout is generous, and the checks run at once.
CONNECT_TIMEOUT_S = 5
CONNECTS = (
    "import socket, sys\n"
    "try:\n"
    "    to = (sys.argv[1], int(sys.argv[2]))\n"
    f"    with socket.create_connection(to, timeout={CONNECT_TIMEOUT_S}) as c:\n"
    "        sys.exit(0 if c.recv(16) == sys.argv[2].encode() else 1)\n"
    "except OSError:\n"
    "    sys.exit(1)\n"
)


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA, as the cluster's CA bundle is to curl."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "api.crt", directory / "api.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def cilium_node(name: str, node_ip: str, pod_cidrs: list[str]) -> dict:
    """A CiliumNode as the agent and the cluster-pool operator leave it (cilium/cilium
    pkg/k8s/apis/cilium.io/client/crds/v2/ciliumnodes.yaml: spec.addresses, spec.ipam.podCIDRs)."""
    return {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNode",
        "metadata": {"name": name, "labels": {"eks.amazonaws.com/compute-type": "hybrid"}},
        "spec": {
            "addresses": [
                {"type": "InternalIP", "ip": node_ip},
                {"type": "CiliumInternalIP", "ip": str(ipaddress.IPv4Network(pod_cidrs[0])[1])},
            ],
            "ipam": {"podCIDRs": pod_cidrs},
        },
    }


def k8s_node(name: str, **labels) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def wg_show(spaces: Namespaces, ns: str, interface: str, field: str) -> dict[str, list[str]]:
    """`wg show <interface> <field>`: peer public key -> the rest of its line."""
    out = spaces.run(ns, "wg", "show", interface, field).stdout
    return {line.split("\t")[0]: line.split("\t")[1:] for line in out.splitlines()}


class Gateway:
    """The gateway's namespace with its interface up, a VPC host behind it, the fake AWS CLI
    and API server, and the sync program as the gateway runs it."""

    def __init__(self, tmp_path: Path, namespaces: Namespaces, machines: dict[str, Spoke]):
        self.tmp, self.spaces, self.machines = tmp_path, namespaces, machines
        self.key = generate_private_key()
        self.hub = Hub(self.key, NETWORK[1], "203.0.113.10", 51820, (VPC,), (PODS,))
        underlay = {
            "gateway": "203.0.113.10/24",
            "alice-4090": "203.0.113.2/24",
            "bob-cpu": "203.0.113.3/24",
        }
        self.ns = {
            name: namespaces.add(name, underlay=address) for name, address in underlay.items()
        }
        self.gw = self.ns["gateway"]
        # The VPC: a host behind the gateway's second port (its ENI's VPC side).
        self.vpc = namespaces.add("vpc")
        namespaces.run(
            self.gw,
            "ip",
            "link",
            "add",
            "vpc0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            self.vpc,
        )
        namespaces.run(self.gw, "ip", "addr", "add", "10.20.0.1/16", "dev", "vpc0")
        namespaces.run(self.gw, "ip", "link", "set", "vpc0", "up")
        namespaces.run(self.vpc, "ip", "addr", "add", "10.20.0.5/16", "dev", "eth0")
        namespaces.run(self.vpc, "ip", "link", "set", "eth0", "up")
        for remote in (NETWORK, PODS):
            namespaces.run(self.vpc, "ip", "route", "add", str(remote), "via", "10.20.0.1")
        self.interfaces = {name: namespaces.interface(name[:5]) for name in underlay}
        self.interface = self.interfaces["gateway"]
        forward = tmp_path / "forward"
        forward.write_text(forward_rules(GatewayNetworks(VPC, (NETWORK,), (PODS,))))
        forward.chmod(0o700)
        configs = {name: tmp_path / f"{i}.conf" for name, i in self.interfaces.items()}
        # The gateway's boot: its [Interface] with the key put in, as user data's sed does.
        interface = gateway_interface(KEY_PLACEHOLDER, NETWORK[1], NETWORK, 51820, (PODS,))
        configs["gateway"].write_text(
            interface.replace(KEY_PLACEHOLDER, self.key).replace(FORWARD_SCRIPT, str(forward))
        )
        for name, spoke in machines.items():
            configs[name].write_text(spoke_config(self.hub, NETWORK, spoke))
        for config in configs.values():
            config.chmod(0o600)
        self.configs = configs
        cert, key = self_signed(tmp_path)
        self.cert = cert
        self.api_state, self.aws_state = tmp_path / "api.json", tmp_path / "aws.json"
        self.api_state.write_text(json.dumps({"nodes": [], "ciliumnodes": []}))
        (tmp_path / "api.py").write_text(FAKE_API.format(token=TOKEN))
        self.port_file = tmp_path / "api.port"
        server = [
            str(tmp_path / "api.py"),
            str(self.api_state),
            str(cert),
            str(key),
            str(self.port_file),
        ]
        self.api = namespaces.popen(self.gw, sys.executable, *server)
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        (self.bin / "aws").write_text(
            FAKE_AWS.format(
                python=sys.executable,
                region=TARGET.region,
                path=TARGET.peers_path,
                cluster=TARGET.cluster,
                token=TOKEN,
            )
        )
        (self.bin / "aws").chmod(0o755)
        self.program, self.settings = tmp_path / "hybrid-wireguard-peers", tmp_path / "settings"
        self.program.write_text(sync_program())
        self.settings.write_text(TARGET.settings())
        for attempt in range(50):  # the API server writes its port once it listens
            if self.port_file.exists() and self.port_file.read_text():
                break
            assert self.api.poll() is None and attempt < 49, "the fake API server did not start"
            time.sleep(0.1)
        namespaces.wg_quick(self.gw, "up", configs["gateway"])

    def state(self, machines, instances, nodes, cilium_nodes, fail: bool = False) -> None:
        """The machines' parameters (by activation; bob's node found by his name if he has no
        activation), the managed instances SSM registered, and the cluster's objects."""
        self.aws_state.write_text(
            json.dumps(
                {
                    "parameters": {
                        f"{PEERS_PATH}/{name}": machine_parameter(
                            name,
                            public_key(spoke.private_key),
                            str(spoke.address),
                            ACTIVATIONS[name],
                        )
                        for name, spoke in machines.items()
                    },
                    "instances": instances,
                    "endpoint": f"https://127.0.0.1:{self.port_file.read_text()}",
                    "ca": base64.b64encode(self.cert.read_bytes()).decode(),
                }
            )
        )
        kept = json.loads(self.api_state.read_text())
        self.api_state.write_text(
            json.dumps(
                {
                    "nodes": nodes if nodes is not None else kept["nodes"],
                    "ciliumnodes": cilium_nodes,
                    "fail": fail,
                    "patches": kept.get("patches", []),
                }
            )
        )

    def nodes(self) -> dict[str, dict]:
        current = json.loads(self.api_state.read_text())
        return {n["metadata"]["name"]: n["metadata"]["labels"] for n in current["nodes"]}

    def sync(self):
        path = f"{self.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        env = {"PATH": path, "FAKE_AWS_STATE": str(self.aws_state)}
        return self.spaces.run(
            self.gw,
            sys.executable,
            str(self.program),
            str(self.settings),
            self.interface,
            env=env,
            check=False,
        )

    def allowed(self) -> dict[str, list[str]]:
        return {
            peer: ips[0].split()
            for peer, ips in wg_show(self.spaces, self.gw, self.interface, "allowed-ips").items()
        }

    def up(self, machine: str) -> None:
        self.spaces.wg_quick(self.ns[machine], "up", self.configs[machine])

    def connects(self, ns: str, address: str, port: int) -> bool:
        done = self.spaces.run(ns, sys.executable, "-c", CONNECTS, address, str(port), check=False)
        return done.returncode == 0


def test_the_sync_labels_the_machines_nodes_and_routes_their_pod_cidrs_in_place(
    tmp_path, namespaces
):
    machines = {
        "alice-4090": Spoke(
            "alice-4090", generate_private_key(), ipaddress.IPv4Address("10.200.0.2")
        ),
        "bob-cpu": Spoke("bob-cpu", generate_private_key(), ipaddress.IPv4Address("10.200.0.3")),
    }
    gateway = Gateway(tmp_path, namespaces, machines)
    pub = {name: public_key(spoke.private_key) for name, spoke in machines.items()}
    alice_only = {"alice-4090": machines["alice-4090"]}
    ping = None
    try:
        # Alice only: SSM registered her activation as mi-0alice. Her node is labelled as her
        # machine; an EC2 pool's node keeps its own pool label; a node carrying machine labels
        # it did not get from the gateway (one that registered again, say) loses them.
        alice_node = cilium_node("mi-0alice", "10.200.0.2", ["10.201.7.0/24"])
        nodes = [
            k8s_node("mi-0alice", **{"eks.amazonaws.com/compute-type": "hybrid"}),
            k8s_node("ip-10-20-1-1.ec2.internal", **{POOL_LABEL: "gpu-small"}),
            k8s_node("mi-0stale", **{POOL_LABEL: "hybrid", MACHINE_LABEL: "alice-4090"}),
        ]
        gateway.state(alice_only, {ACTIVATIONS["alice-4090"]: "mi-0alice"}, nodes, [alice_node])
        done = gateway.sync()
        assert done.returncode == 0, done.stdout + done.stderr
        assert gateway.allowed() == {pub["alice-4090"]: ["10.200.0.2/32", "10.201.7.0/24"]}
        labels = gateway.nodes()
        assert labels["mi-0alice"][POOL_LABEL] == "hybrid"
        assert labels["mi-0alice"][MACHINE_LABEL] == "alice-4090"
        assert labels["ip-10-20-1-1.ec2.internal"] == {POOL_LABEL: "gpu-small"}
        assert labels["mi-0stale"] == {}
        gateway.up("alice-4090")
        # syncconf sets the interface to the file: key and port must survive it.
        gw, iface = gateway.gw, gateway.interface
        assert namespaces.run(gw, "wg", "show", iface, "private-key").stdout == gateway.key + "\n"
        assert namespaces.run(gw, "wg", "show", iface, "listen-port").stdout == "51820\n"
        namespaces.run(gateway.ns["alice-4090"], "ip", "addr", "add", "10.201.7.1/32", "dev", "lo")
        assert namespaces.reaches(gateway.ns["alice-4090"], "10.200.0.1")
        assert namespaces.reaches(gw, "10.201.7.1"), "the gateway routes alice's pod slice to her"
        ping = namespaces.popen(
            gateway.ns["alice-4090"],
            "ping",
            "-i",
            "0.2",
            "10.200.0.1",
            stdout=subprocess.PIPE,
            text=True,
        )
        handshake = wg_show(namespaces, gw, iface, "latest-handshakes")
        received = int(wg_show(namespaces, gw, iface, "transfer")[pub["alice-4090"]][0])

        # Bob joins. His CiliumNode also claims the VPC, and his agent's credentials (which may
        # write any CiliumNode) forge two more: one under a node no machine registered, one
        # claiming part of alice's slice. None of it reaches a peer: the VPC is no pod CIDR,
        # mi-0evil is no machine's node, and a slice two CiliumNodes claim goes to neither.
        bob_node = cilium_node("mi-0bob", "10.200.0.2", ["10.201.9.0/24", str(VPC)])
        forged = [
            cilium_node("mi-0evil", "10.200.0.3", ["10.201.11.0/24"]),
            cilium_node("mi-0bob-too", "10.200.0.3", ["10.201.7.128/25"]),
        ]
        instances = {ACTIVATIONS[m]: f"mi-0{m.split('-')[0]}" for m in machines}
        nodes = [*nodes[:2], k8s_node("mi-0bob"), k8s_node("mi-0evil")]
        gateway.state(machines, instances, nodes, [alice_node, bob_node, *forged])
        done = gateway.sync()
        assert done.returncode == 0, done.stdout + done.stderr
        assert gateway.allowed() == {
            pub["alice-4090"]: ["10.200.0.2/32"],
            pub["bob-cpu"]: ["10.200.0.3/32", "10.201.9.0/24"],
        }
        assert gateway.nodes()["mi-0bob"] == {POOL_LABEL: "hybrid", MACHINE_LABEL: "bob-cpu"}
        assert gateway.nodes()["mi-0evil"] == {}
        gateway.up("bob-cpu")
        namespaces.run(gateway.ns["bob-cpu"], "ip", "addr", "add", "10.201.9.1/32", "dev", "lo")
        assert namespaces.reaches(gateway.ns["bob-cpu"], "10.200.0.1")
        assert namespaces.reaches(gw, "10.201.9.1")

        # The forgeries gone, alice's slice is hers again.
        gateway.state(machines, instances, None, [alice_node, bob_node])
        assert gateway.sync().returncode == 0
        assert gateway.allowed()[pub["alice-4090"]] == ["10.200.0.2/32", "10.201.7.0/24"]

        # Bob leaves the stack: his peer goes, his node loses the machine's labels.
        gateway.state(
            alice_only, {ACTIVATIONS["alice-4090"]: "mi-0alice"}, None, [alice_node, bob_node]
        )
        assert gateway.sync().returncode == 0
        assert gateway.allowed() == {pub["alice-4090"]: ["10.200.0.2/32", "10.201.7.0/24"]}
        assert gateway.nodes()["mi-0bob"] == {}
        assert not namespaces.reaches(gateway.ns["bob-cpu"], "10.200.0.1", attempts=2)

        # The cluster does not answer: nothing changes, and the run says it failed.
        gateway.state(machines, instances, None, [alice_node, bob_node], fail=True)
        assert gateway.sync().returncode != 0
        assert gateway.allowed() == {pub["alice-4090"]: ["10.200.0.2/32", "10.201.7.0/24"]}

        # Alice's session outlived every reload: same handshake, counters never reset, and her
        # ping to the gateway lost nothing.
        assert namespaces.reaches(gw, "10.201.7.1")
        after = wg_show(namespaces, gw, iface, "latest-handshakes")
        assert after[pub["alice-4090"]] == handshake[pub["alice-4090"]]
        assert int(wg_show(namespaces, gw, iface, "transfer")[pub["alice-4090"]][0]) > received
    finally:
        if ping is not None:
            stop(ping)
        stop(gateway.api)
    summary = re.search(r"(\d+) packets transmitted, (\d+) received", ping.communicate()[0])
    sent, got = int(summary[1]), int(summary[2])
    # All answered but, at most, the one in flight when the ping was stopped.
    assert sent >= 5 and got >= sent - 1, summary[0]


def test_the_gateway_forwards_what_hybrid_nodes_need_and_nothing_else(tmp_path, namespaces):
    """Between the VPC and the machines, and between machines, only the traffic of
    hybrid_gateway_boot's lists crosses the gateway; a machine reaches no port of the gateway
    itself. Each check is a TCP connection to a listener that answers on every port asked."""
    machines = {
        "alice-4090": Spoke(
            "alice-4090", generate_private_key(), ipaddress.IPv4Address("10.200.0.2")
        ),
        "bob-cpu": Spoke("bob-cpu", generate_private_key(), ipaddress.IPv4Address("10.200.0.3")),
    }
    gateway = Gateway(tmp_path, namespaces, machines)
    instances = {ACTIVATIONS[m]: f"mi-0{m.split('-')[0]}" for m in machines}
    slices = {"alice-4090": "10.201.7.0/24", "bob-cpu": "10.201.9.0/24"}
    cilium = [
        cilium_node(instances[ACTIVATIONS[m]], str(machines[m].address), [slices[m]])
        for m in machines
    ]
    gateway.state(machines, instances, [], cilium)
    done = gateway.sync()
    assert done.returncode == 0, done.stdout + done.stderr
    alice, bob = gateway.ns["alice-4090"], gateway.ns["bob-cpu"]
    namespaces.run(alice, "ip", "addr", "add", "10.201.7.1/32", "dev", "lo")
    listeners = [
        namespaces.popen(
            ns, sys.executable, "-c", LISTENER, *ports, stdout=subprocess.PIPE, text=True
        )
        for ns, ports in (
            (alice, ("10250", "22", "8080")),
            (bob, ("22",)),
            (gateway.vpc, ("443", "53", "22")),
            (gateway.gw, ("2222",)),
        )
    ]
    try:
        for machine in machines:
            gateway.up(machine)
        assert namespaces.reaches(alice, "10.200.0.1")
        assert namespaces.reaches(bob, "10.200.0.1")
        assert [listener.stdout.readline() for listener in listeners] == ["listening\n"] * 4
        allowed = {
            "VPC to a kubelet": (gateway.vpc, "10.200.0.2", 10250),
            "VPC to a pod": (gateway.vpc, "10.201.7.1", 8080),
            "machine to the API server": (alice, "10.20.0.5", 443),
            "machine to DNS": (alice, "10.20.0.5", 53),
        }
        refused = {
            "VPC to a machine's sshd": (gateway.vpc, "10.200.0.2", 22),
            "machine to the VPC's sshd": (alice, "10.20.0.5", 22),
            "machine to machine": (alice, "10.200.0.3", 22),
            "machine to the gateway": (alice, "10.200.0.1", 2222),
        }
        checks = {**allowed, **refused}
        with ThreadPoolExecutor(len(checks)) as pool:
            answers = pool.map(lambda to: gateway.connects(*to), checks.values())
        assert dict(zip(checks, answers, strict=True)) == {what: what in allowed for what in checks}
        # Cilium's health checks between nodes: ICMP echo.
        assert namespaces.reaches(alice, "10.200.0.3")
    finally:
        for listener in listeners:
            stop(listener)
        stop(gateway.api)


# systemd.timer(5) (systemd v252, AL2023's): a monotonic timer elapses up to AccuracySec after it
# is due, default 1min; durations are systemd.time(7) spans.
SYSTEMD_DEFAULT_ACCURACY_SECONDS = 60
SPAN_UNITS = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}


def span_seconds(span: str) -> float:
    return sum(
        float(number) * SPAN_UNITS[unit or "s"]
        for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span)
    )


def test_the_peer_sync_runs_every_interval_not_up_to_a_minute_later():
    timer = sync_units()[f"{SYNC_UNIT}.timer"]
    settings = dict(re.findall(r"^(\w+)=(.*)$", timer, re.MULTILINE))
    assert span_seconds(settings["OnUnitActiveSec"]) == SYNC_SECONDS
    accuracy = span_seconds(settings.get("AccuracySec", f"{SYSTEMD_DEFAULT_ACCURACY_SECONDS}s"))
    assert accuracy <= SYNC_SECONDS / 10, f"each run may come {accuracy:.0f} s late"
