"""tp-mesh on real networks the tests build in network namespaces: its own WireGuard as a full mesh
with a node behind NAT (wireguard-go brought up by wg-quick from the configs `tp-mesh wireguard`
writes, with keys `tp-mesh keygen` made), and a launch over a tailnet. No Tailscale runs here: the
tailnet is two namespaces joined by a link named tailscale0 on both sides, each holding its
100.64.0.0/10 address as a /32 on it, as tailscaled gives a Linux machine, and a route for the
range through it. Each runs OpenSSH's sshd (tests/openssh.py) on a LAN it shares with a third
namespace, the laptop, where tp-mesh runs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mesh import cli
from tests.netns import Namespaces
from tests.openssh import OpenSsh
from tests.plugin import ROOT
from trainer.data import DEFAULT_TOKENS, ensure_default_tokens


@pytest.fixture
def spaces():
    """Network namespaces named after this branch, removed with their processes at the end."""
    created = Namespaces("mesh-direct")
    yield created
    created.close()


def keygen(key_file: Path, capsys) -> str:
    """`tp-mesh keygen` as run on one machine: its public key."""
    assert cli.main(["keygen", "--key-file", str(key_file)]) == 0
    return capsys.readouterr().out.strip()


def forwarded(spaces: Namespaces, ns: str, interface: str) -> int:
    """Packets the hub's accept-between-peers rule has let through."""
    listing = spaces.run(ns, "iptables", "-L", "FORWARD", "-v", "-x", "-n").stdout
    for line in listing.splitlines()[2:]:
        pkts, _bytes, target, _prot, _opt, into, out, *_ = line.split()
        if (target, into, out) == ("ACCEPT", interface, interface):
            return int(pkts)
    raise AssertionError(f"no accept rule for {interface} in:\n{listing}")


def received(spaces: Namespaces, ns: str, interface: str, public_key: str) -> int:
    """Bytes `wg show` says this interface received from the peer."""
    for line in spaces.run(ns, "wg", "show", interface, "transfer").stdout.splitlines():
        key, rx, _tx = line.split("\t")
        if key == public_key:
            return int(rx)
    raise AssertionError(f"no peer {public_key} on {interface}")


def test_full_mesh_goes_direct_between_endpoints_and_through_the_hub_behind_nat(
    tmp_path, spaces, capsys
):
    """Four machines: the hub and two more with public endpoints, one behind a masquerading
    router with none. Every machine's FORWARD policy is DROP, as Docker leaves it. The two with
    endpoints talk directly: the hub forwards none of their packets and they still talk with
    the hub's WireGuard down. The NAT-ed one is reached (first contact from the other side)
    and reaches everyone through the hub, thanks to the hub's forward rule."""
    underlay = {"hub": "192.0.2.1", "a": "192.0.2.2", "b": "192.0.2.3"}
    names = [*underlay, "nat"]
    key_files = {name: tmp_path / name / "wg0.key" for name in names}
    public = {name: keygen(key_files[name], capsys) for name in names}
    nodes = [
        {
            "name": name,
            "ssh": {"host": underlay.get(name, "192.168.77.2")},
            "publicKey": public[name],
            "privateKeyFile": str(key_files[name]),
        }
        | ({"endpoint": underlay[name]} if name in underlay else {})
        for name in names
    ]
    mesh = tmp_path / "mesh.yaml"
    mesh.write_text(
        yaml.safe_dump({"network": "10.77.0.0/24", "coordinator": "hub", "nodes": nodes})
    )
    assert cli.main(["wireguard", str(mesh), "--out", str(tmp_path / "out")]) == 0
    address = {name: f"10.77.0.{i}" for i, name in enumerate(names, start=1)}

    ns = {name: spaces.add(name, underlay=f"{ip}/24") for name, ip in underlay.items()}
    ns["nat"] = spaces.add_behind_nat("nat", router_underlay="192.0.2.9/24")
    interface = {name: spaces.interface(name) for name in names}
    configs = {}
    for name in names:
        # What the user installs as /etc/wireguard/wg0.conf, under a name unique on this machine.
        configs[name] = tmp_path / f"{interface[name]}.conf"
        configs[name].write_text((tmp_path / "out" / f"{name}.conf").read_text())
        configs[name].chmod(0o600)
        spaces.run(ns[name], "iptables", "-P", "FORWARD", "DROP")
        spaces.wg_quick(ns[name], "up", configs[name])

    # Behind NAT: reachable at once (its keepalive went out as its interface came up), from the
    # hub and, through the hub, from a node with an endpoint; and it reaches the others.
    assert spaces.reaches(ns["hub"], address["nat"])
    assert spaces.reaches(ns["a"], address["nat"])
    assert spaces.reaches(ns["nat"], address["b"])

    # Direct: a and b exchange packets without the hub forwarding any of them.
    before = forwarded(spaces, ns["hub"], interface["hub"])
    from_b = received(spaces, ns["a"], interface["a"], public["b"])
    assert spaces.reaches(ns["a"], address["b"])
    assert spaces.reaches(ns["b"], address["a"])
    assert forwarded(spaces, ns["hub"], interface["hub"]) == before
    assert received(spaces, ns["a"], interface["a"], public["b"]) > from_b
    assert spaces.reaches(ns["nat"], address["a"])
    assert forwarded(spaces, ns["hub"], interface["hub"]) >= before + 2  # request and reply

    # The hub without its forward rule: the NAT-ed node is cut off from the others.
    rule = ["FORWARD", "-i", interface["hub"], "-o", interface["hub"], "-j", "ACCEPT"]
    spaces.run(ns["hub"], "iptables", "-D", *rule)
    assert not spaces.reaches(ns["nat"], address["a"], attempts=2)
    spaces.run(ns["hub"], "iptables", "-A", *rule)
    assert spaces.reaches(ns["nat"], address["a"])

    # The hub's WireGuard down (its PostDown takes the rule away): a and b still talk.
    spaces.wg_quick(ns["hub"], "down", configs["hub"])
    assert "ACCEPT" not in spaces.run(ns["hub"], "iptables", "-S", "FORWARD").stdout
    assert spaces.reaches(ns["a"], address["b"])
    assert not spaces.reaches(ns["nat"], address["b"], attempts=2)


TAILNET = {"hub": "100.101.0.1", "peer": "100.101.0.2"}
LAN = {"hub": "192.0.2.1", "peer": "192.0.2.2", "laptop": "192.0.2.9"}
SSH_PORT = 2222  # sshd runs as a user, who cannot bind port 22


@pytest.fixture
def tailnet(spaces):
    """Two machines on a tailnet stand-in, each with sshd in its namespace answering on a LAN
    (the namespaces' bridge), and a laptop on the LAN; a mesh file for the two, with network:
    tailnet, the client key and the known_hosts of their sshd."""
    ensure_default_tokens(ROOT / DEFAULT_TOKENS)  # read by the trainer, which may not write there
    ns = {name: spaces.add(name, underlay=f"{LAN[name]}/24") for name in TAILNET}
    laptop = spaces.add("laptop", underlay=f"{LAN['laptop']}/24")
    link = ["ip", "link", "add", "tailscale0", "type", "veth", "peer", "name", "tailscale0"]
    spaces.run(ns["hub"], *link, "netns", ns["peer"])
    for name, address in TAILNET.items():
        spaces.run(ns[name], "ip", "addr", "add", f"{address}/32", "dev", "tailscale0")
        spaces.run(ns[name], "ip", "link", "set", "tailscale0", "up")
        spaces.run(ns[name], "ip", "route", "add", "100.64.0.0/10", "dev", "tailscale0")
    with OpenSsh() as site:
        for name in TAILNET:
            inside = tuple(spaces.exec_prefix(ns[name]))
            site.serve(name, LAN[name], inside=inside, port=SSH_PORT)
        document = {
            "network": "tailnet",
            "coordinator": "hub",
            "knownHosts": str(site.known_hosts),
            "nodes": [
                {
                    "name": name,
                    "address": TAILNET[name],
                    "ssh": {
                        "host": LAN[name],
                        "port": SSH_PORT,
                        "user": site.account.name,
                        "keyFile": str(site.client_key),
                    },
                    "python": sys.executable,
                    "workdir": str(ROOT),
                }
                for name in TAILNET
            ],
        }
        mesh = site.write(site.dir / "mesh.yaml", yaml.safe_dump(document))
        yield site, mesh, ns, laptop


def tp_mesh(spaces, laptop: str, *argv: str) -> subprocess.CompletedProcess:
    """`tp-mesh ARGV` run on the laptop."""
    return spaces.run(laptop, sys.executable, "-m", "mesh.cli", *argv, check=False, cwd=ROOT)


def test_launch_over_a_tailnet_needs_no_wireguard_and_probes_the_rendezvous_port(
    tmp_path, spaces, tailnet, capsys
):
    site, mesh, ns, laptop = tailnet
    port = 29400  # the default: each machine has ports of its own
    assert cli.main(["wireguard", str(mesh), "--out", str(tmp_path / "out")]) == 0
    assert "no WireGuard" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()

    # The check connects from each node's tailnet address to the coordinator's rendezvous port:
    # with the tailnet refusing the peer's connection (as an ACL would), the peer is not ready.
    reject = ["OUTPUT", "-o", "tailscale0", "-p", "tcp", "--dport", str(port), "-j", "REJECT"]
    spaces.run(ns["peer"], "iptables", "-A", *reject, "--reject-with", "tcp-reset")
    checked = tp_mesh(spaces, laptop, "check", str(mesh))
    out = checked.stdout
    assert checked.returncode == 1, out + checked.stderr
    assert "hub: CPU-only" in out and "hub: CPU-only (no nvidia-smi GPUs); torch" in out
    assert (
        "peer: CPU-only (no nvidia-smi GPUs); torch" in out
        and f"NOT READY: cannot reach the coordinator's rendezvous port 100.101.0.1:{port} "
        "from 100.101.0.2: ConnectionRefusedError"
        in out
    ), out
    spaces.run(ns["peer"], "iptables", "-D", *reject, "--reject-with", "tcp-reset")
    # Something else holds the rendezvous port on the coordinator: named there.
    holder = spaces.popen(
        ns["hub"],
        sys.executable,
        "-c",
        "import socket, sys; s = socket.create_server(('100.101.0.1', int(sys.argv[1]))); "
        "print('up', flush=True); sys.stdin.read()",
        str(port),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == b"up\n"
        checked = tp_mesh(spaces, laptop, "check", str(mesh))
        out = checked.stdout
        assert checked.returncode == 1, out + checked.stderr
        assert (
            f"cannot listen on its rendezvous address 100.101.0.1:{port}: OSError: [Errno 98]"
            in out
        )
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)

    run = site.mkdir("run")
    metrics = run / "metrics.jsonl"
    argv = ["launch", str(mesh), "--nnodes", "2", "--max-restarts", "0", "--", "-m", "trainer"]
    argv += ["--steps", "2", "--global-batch", "4", "--micro-batch", "2", "--threads", "1"]
    argv += ["--checkpoint-every", "2", "--eval-every", "100", "--log-every", "1"]
    argv += ["--checkpoint-dir", str(run / "ckpt"), "--metrics", str(metrics)]
    launched = tp_mesh(spaces, laptop, *argv)
    out = launched.stdout
    assert launched.returncode == 0, (out + launched.stderr)[-3000:]
    assert "hub: CPU-only (no nvidia-smi GPUs); torch" in out and "; ready" in out
    assert "[hub] torchrun exited with 0" in out and "[peer] torchrun exited with 0" in out
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert next(r for r in records if r.get("event") == "start")["world_size"] == 2
    assert records[-1]["event"] == "done"
