"""The hybrid nodes' WireGuard gateway reloads its peers in place: its generated sync script run
for real against wireguard-go in network namespaces, the gateway and two machines on an underlay
bridge. Only what the gateway asks of AWS is stubbed, at the AWS CLI: a fake `aws` on PATH prints
what the real one prints for those calls. The cluster's CiliumNodes come from a local HTTPS
server shaped like the Kubernetes API, since no API server runs here."""

import base64
import datetime
import ipaddress
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from infra.components.hybrid_gateway_boot import (
    KEY_PLACEHOLDER,
    SYNC_SECONDS,
    SYNC_UNIT,
    SyncTarget,
    sync_script,
    sync_units,
)
from mesh.wireguard import (
    Hub,
    Spoke,
    generate_private_key,
    hub_interface,
    peer_section,
    public_key,
    spoke_config,
)
from tests.netns import Namespaces, stop

NETWORK = ipaddress.IPv4Network("10.200.0.0/24")
PODS = ipaddress.IPv4Network("10.201.0.0/16")
VPC = ipaddress.IPv4Network("10.20.0.0/16")
PEERS_PATH = "/training-platform/test/hybrid-wireguard-peers"
TARGET = SyncTarget("us-west-2", "tp-test", PEERS_PATH, (PODS,))
TOKEN = "k8s-aws-v1.offline-token"

# The AWS CLI for the three calls the sync makes, printing what the real one prints (response
# shapes in infra/components/hybrid_gateway_boot.py); any other call fails loudly.
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
    ("eks", "get-token", "--region", "{region}", "--cluster-name", "{cluster}"): {{
        "kind": "ExecCredential",
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "spec": {{}},
        "status": {{"expirationTimestamp": "2026-11-24T12:14:00Z", "token": "{token}"}},
    }},
}}
if tuple(args) not in calls:
    sys.exit(f"fake aws: unexpected call {{args}}")
print(json.dumps(calls[tuple(args)], indent=4))
"""

# GET /apis/cilium.io/v2/ciliumnodes as the API server answers it: a CiliumNodeList, for the
# bearer token only. The items are the test's, read on every request.
FAKE_API = """
import http.server, json, ssl, sys
state, cert, key, port_file = sys.argv[1:]

class Api(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        current = json.load(open(state))
        if self.headers.get("Authorization") != "Bearer {token}":
            return self.send_error(401)
        if self.path != "/apis/cilium.io/v2/ciliumnodes" or current.get("fail"):
            return self.send_error(404 if not current.get("fail") else 500)
        body = json.dumps(
            {{"apiVersion": "cilium.io/v2", "kind": "CiliumNodeList",
              "metadata": {{"resourceVersion": "1"}}, "items": current["ciliumnodes"]}}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

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


def wg_show(spaces: Namespaces, ns: str, interface: str, field: str) -> dict[str, list[str]]:
    """`wg show <interface> <field>`: peer public key -> the rest of its line."""
    out = spaces.run(ns, "wg", "show", interface, field).stdout
    return {line.split("\t")[0]: line.split("\t")[1:] for line in out.splitlines()}


def test_gateway_reloads_peers_in_place_and_routes_each_nodes_pod_cidr(tmp_path, namespaces):
    keys = {name: generate_private_key() for name in ("gateway", "alice", "bob")}
    hub = Hub(
        keys["gateway"], ipaddress.IPv4Address("10.200.0.1"), "203.0.113.10", 51820, (VPC,), (PODS,)
    )
    machines = {
        "alice": Spoke("alice-4090", keys["alice"], ipaddress.IPv4Address("10.200.0.2")),
        "bob": Spoke("bob-cpu", keys["bob"], ipaddress.IPv4Address("10.200.0.3")),
    }
    underlay = {"gateway": "203.0.113.10/24", "alice": "203.0.113.2/24", "bob": "203.0.113.3/24"}
    ns = {name: namespaces.add(name, underlay=address) for name, address in underlay.items()}
    gw = ns["gateway"]
    interfaces = {name: namespaces.interface(name) for name in underlay}
    configs = {name: tmp_path / f"{interface}.conf" for name, interface in interfaces.items()}
    # The gateway's boot: its [Interface] with the key put in, as user data's sed does.
    placeholder = Hub(KEY_PLACEHOLDER, hub.address, "", hub.listen_port, behind_spokes=(PODS,))
    configs["gateway"].write_text(
        hub_interface(placeholder, NETWORK).replace(KEY_PLACEHOLDER, keys["gateway"])
    )
    for name, spoke in machines.items():
        configs[name].write_text(spoke_config(hub, NETWORK, spoke))
    for config in configs.values():
        config.chmod(0o600)
    # Each machine's "pod": an address in the slice Cilium gave its node.
    namespaces.run(ns["alice"], "ip", "addr", "add", "10.201.7.1/32", "dev", "lo")
    namespaces.run(ns["bob"], "ip", "addr", "add", "10.201.9.1/32", "dev", "lo")

    cert, key = self_signed(tmp_path)
    api_state, aws_state = tmp_path / "api.json", tmp_path / "aws.json"
    api_state.write_text(json.dumps({"ciliumnodes": []}))
    (tmp_path / "api.py").write_text(FAKE_API.format(token=TOKEN))
    port_file = tmp_path / "api.port"
    server = [str(tmp_path / "api.py"), str(api_state), str(cert), str(key), str(port_file)]
    api = namespaces.popen(gw, sys.executable, *server)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "aws").write_text(
        FAKE_AWS.format(
            python=sys.executable,
            region=TARGET.region,
            path=TARGET.peers_path,
            cluster=TARGET.cluster,
            token=TOKEN,
        )
    )
    (bin_dir / "aws").chmod(0o755)
    script = tmp_path / "hybrid-wireguard-peers"
    script.write_text(sync_script(TARGET))
    ping = None

    def state(parameters: dict[str, Spoke], nodes: list[dict], fail: bool = False) -> None:
        aws_state.write_text(
            json.dumps(
                {
                    "parameters": {
                        f"{TARGET.peers_path}/{spoke.name}": peer_section(spoke)
                        for spoke in parameters.values()
                    },
                    "endpoint": f"https://127.0.0.1:{port_file.read_text()}",
                    "ca": base64.b64encode(cert.read_bytes()).decode(),
                }
            )
        )
        api_state.write_text(json.dumps({"ciliumnodes": nodes, "fail": fail}))

    def sync():
        path = f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        env = {"PATH": path, "FAKE_AWS_STATE": str(aws_state)}
        return namespaces.run(gw, "bash", str(script), interfaces["gateway"], env=env, check=False)

    def allowed() -> dict[str, list[str]]:
        return {
            peer: ips[0].split()
            for peer, ips in wg_show(namespaces, gw, interfaces["gateway"], "allowed-ips").items()
        }

    pub = {name: public_key(spoke.private_key) for name, spoke in machines.items()}
    try:
        for attempt in range(50):  # the API server writes its port once it listens
            if port_file.exists() and port_file.read_text():
                break
            assert api.poll() is None and attempt < 49, "the fake API server did not start"
            time.sleep(0.1)
        namespaces.wg_quick(gw, "up", configs["gateway"])

        # Alice only, her node with the slice 10.201.7.0/24.
        alice_node = cilium_node("mi-0alice", "10.200.0.2", ["10.201.7.0/24"])
        state({"alice": machines["alice"]}, [alice_node])
        done = sync()
        assert done.returncode == 0, done.stdout + done.stderr
        assert allowed() == {pub["alice"]: ["10.200.0.2/32", "10.201.7.0/24"]}
        namespaces.wg_quick(ns["alice"], "up", configs["alice"])
        # syncconf sets the interface to the file: key and port must survive it.
        assert namespaces.run(gw, "wg", "show", interfaces["gateway"], "private-key").stdout == (
            keys["gateway"] + "\n"
        )
        assert namespaces.run(gw, "wg", "show", interfaces["gateway"], "listen-port").stdout == (
            "51820\n"
        )
        assert namespaces.reaches(ns["alice"], "10.200.0.1")
        assert namespaces.reaches(gw, "10.201.7.1"), "the gateway routes alice's pod slice to her"
        ping = namespaces.popen(
            ns["alice"], "ping", "-i", "0.2", "10.200.0.1", stdout=subprocess.PIPE, text=True
        )
        handshake = wg_show(namespaces, gw, interfaces["gateway"], "latest-handshakes")
        received = int(wg_show(namespaces, gw, interfaces["gateway"], "transfer")[pub["alice"]][0])

        # Bob joins; his CiliumNode also claims the VPC, which the gateway must not route to him.
        bob_node = cilium_node("mi-0bob", "10.200.0.3", ["10.201.9.0/24", str(VPC)])
        state(machines, [alice_node, bob_node])
        done = sync()
        assert done.returncode == 0, done.stdout + done.stderr
        assert allowed() == {
            pub["alice"]: ["10.200.0.2/32", "10.201.7.0/24"],
            pub["bob"]: ["10.200.0.3/32", "10.201.9.0/24"],
        }
        namespaces.wg_quick(ns["bob"], "up", configs["bob"])
        assert namespaces.reaches(ns["bob"], "10.200.0.1")
        assert namespaces.reaches(gw, "10.201.9.1")

        # Bob leaves.
        state({"alice": machines["alice"]}, [alice_node])
        done = sync()
        assert done.returncode == 0, done.stdout + done.stderr
        assert allowed() == {pub["alice"]: ["10.200.0.2/32", "10.201.7.0/24"]}
        assert not namespaces.reaches(ns["bob"], "10.200.0.1", attempts=2)

        # The cluster does not answer: nothing changes, and the run says it failed.
        state(machines, [alice_node, bob_node], fail=True)
        assert sync().returncode != 0
        assert allowed() == {pub["alice"]: ["10.200.0.2/32", "10.201.7.0/24"]}

        # Alice's session outlived every reload: same handshake, counters never reset, and her
        # ping to the gateway lost nothing.
        assert namespaces.reaches(gw, "10.201.7.1")
        after = wg_show(namespaces, gw, interfaces["gateway"], "latest-handshakes")
        assert after[pub["alice"]] == handshake[pub["alice"]]
        assert int(wg_show(namespaces, gw, interfaces["gateway"], "transfer")[pub["alice"]][0]) > (
            received
        )
    finally:
        if ping is not None:
            stop(ping)
        stop(api)
    summary = re.search(r"(\d+) packets transmitted, (\d+) received", ping.communicate()[0])
    sent, got = int(summary[1]), int(summary[2])
    # All answered but, at most, the one in flight when the ping was stopped.
    assert sent >= 5 and got >= sent - 1, summary[0]


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
