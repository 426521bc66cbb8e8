"""tp-mesh: WireGuard configs, the mesh file's validation, and SSH checks and a torchrun launch of
the real trainer against two SSH servers on loopback addresses standing in for two machines."""

import base64
import json
import socket
import stat
import sys
import threading
import time
from pathlib import Path

import paramiko
import pytest
import yaml

from mesh import cli, remote
from mesh.spec import MeshError, load_mesh
from mesh.wireguard import decode_key, generate_private_key, public_key
from tests.sshd import LoopbackSshd, write_known_hosts

ROOT = Path(__file__).resolve().parent.parent
HOSTS = ["127.0.0.2", "127.0.0.3"]


def mesh_file(tmp_path: Path, document: dict) -> Path:
    path = tmp_path / "mesh.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def three_nodes(**overrides) -> dict:
    document = {
        "network": "10.77.0.0/24",
        "coordinator": "hub",
        "nodes": [
            {"name": "hub", "endpoint": "hub.example.org", "ssh": {"host": "hub.example.org"}},
            {"name": "alice", "ssh": {"host": "192.168.1.10", "user": "alice"}},
            {"name": "bob", "address": "10.77.0.9", "ssh": {"host": "bob.lan", "port": 2222}},
        ],
    }
    return document | overrides


def sections(config: str) -> list[dict[str, str | list[str]]]:
    """A wg-quick config as its sections' key/value pairs, in order ([Peer] repeats); a key given
    more than once (PostUp) has the list of its values."""
    found = []
    for line in config.splitlines():
        if line.startswith("["):
            found.append({"section": line.strip("[]")})
        elif "=" in line and not line.startswith("#"):
            key, _, value = (part.strip() for part in line.partition("="))
            if key in found[-1]:
                earlier = found[-1][key]
                found[-1][key] = [*(earlier if isinstance(earlier, list) else [earlier]), value]
            else:
                found[-1][key] = value
    return found


def test_public_key_is_x25519_as_wg_pubkey_computes_it():
    # RFC 7748 section 6.1, Alice's key pair.
    private = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    public = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
    assert public_key(base64.b64encode(private).decode()) == base64.b64encode(public).decode()
    assert len(decode_key(generate_private_key())) == 32
    assert generate_private_key() != generate_private_key()
    for bad in ["", "not base64!", base64.b64encode(b"short").decode()]:
        with pytest.raises(ValueError, match="32 bytes in base64"):
            decode_key(bad)


def test_hub_and_spoke_configs(tmp_path):
    mesh = load_mesh(mesh_file(tmp_path, three_nodes()))
    assert {k: str(v) for k, v in mesh.addresses().items()} == {
        "hub": "10.77.0.1",
        "alice": "10.77.0.2",
        "bob": "10.77.0.9",
    }
    paths = cli.write_configs(mesh, tmp_path / "out")
    keys = {
        p.stem: (tmp_path / "out" / "keys" / f"{p.stem}.key").read_text().strip() for p in paths
    }
    hub, *peers = sections((tmp_path / "out" / "hub.conf").read_text())
    assert hub == {
        "section": "Interface",
        "Address": "10.77.0.1/24",
        "ListenPort": "51820",
        "PrivateKey": keys["hub"],
        "PostUp": [
            "sysctl -w net.ipv4.ip_forward=1",
            "iptables -A FORWARD -i %i -o %i -j ACCEPT",
        ],
        "PostDown": "iptables -D FORWARD -i %i -o %i -j ACCEPT",
    }
    assert peers == [
        {"section": "Peer", "PublicKey": public_key(keys["alice"]), "AllowedIPs": "10.77.0.2/32"},
        {"section": "Peer", "PublicKey": public_key(keys["bob"]), "AllowedIPs": "10.77.0.9/32"},
    ]
    interface, peer = sections((tmp_path / "out" / "bob.conf").read_text())
    assert interface == {
        "section": "Interface",
        "Address": "10.77.0.9/24",
        "PrivateKey": keys["bob"],
    }
    assert peer == {
        "section": "Peer",
        "PublicKey": public_key(keys["hub"]),
        "Endpoint": "hub.example.org:51820",
        "AllowedIPs": "10.77.0.0/24",
        "PersistentKeepalive": "25",
    }
    for path in [*paths, *(tmp_path / "out" / "keys").iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # A second run keeps the keys: configs already installed on the machines stay valid.
    cli.write_configs(mesh, tmp_path / "out")
    assert (tmp_path / "out" / "keys" / "hub.key").read_text().strip() == keys["hub"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"network": "8.8.8.0/24"}, "network 8.8.8.0/24 is public; allowed: inside 10.0.0.0/8"),
        ({"network": "10.77.0.0/31"}, "too small; allowed: /30 or larger"),
        ({"coordinator": "carol"}, "coordinator 'carol' is not a node; allowed: hub, alice, bob"),
        ({"listenPort": 70000}, "listenPort: Input should be less than or equal to 65535"),
        ({"nodes": [{"name": "hub", "ssh": {"host": "h"}}]}, "coordinator 'hub' has no endpoint"),
        (
            {"nodes": [*three_nodes()["nodes"], {"name": "hub", "ssh": {"host": "x"}}]},
            "node names hub repeat",
        ),
        (
            {
                "nodes": [
                    *three_nodes()["nodes"][:2],
                    {"name": "bob", "address": "10.78.0.1", "ssh": {"host": "b"}},
                ]
            },
            "node bob: address 10.78.0.1 is not a host address of 10.77.0.0/24",
        ),
        (
            {
                "nodes": [
                    three_nodes()["nodes"][0],
                    {"name": "alice", "address": "10.77.0.5", "ssh": {"host": "a"}},
                    {"name": "bob", "address": "10.77.0.5", "ssh": {"host": "b"}},
                ]
            },
            "addresses 10.77.0.5 repeat",
        ),
        ({"nodes": [{"name": "Hub!", "ssh": {"host": "h"}}]}, "nodes.0.name: String should match"),
        ({"meshName": "x"}, "meshName: Extra inputs are not permitted"),
    ],
)
def test_invalid_mesh_files_name_the_key(tmp_path, overrides, message):
    with pytest.raises(MeshError, match="Invalid mesh file") as caught:
        load_mesh(mesh_file(tmp_path, three_nodes(**overrides)))
    assert message in str(caught.value)


def test_nnodes_range():
    assert cli.parse_nnodes("2", 3) == (2, 2)
    assert cli.parse_nnodes("1:3", 3) == (1, 3)
    for bad in ["0", "3:2", "1:4", "two", "1:"]:
        with pytest.raises(MeshError, match="MIN:MAX"):
            cli.parse_nnodes(bad, 3)


def test_outcome_counts_finished_nodes_against_min(capsys):
    assert cli.outcome({"hub": 0, "peer": 137}, low=1) == 0
    assert "peer: left the run (torchrun exited with 137)" in capsys.readouterr().err
    assert cli.outcome({"hub": 0, "peer": 137}, low=2) == 1  # a fixed-size run needs every node
    assert "peer: failed (torchrun exited with 137)" in capsys.readouterr().err
    assert cli.outcome({"hub": 1, "peer": 1}, low=1) == 1


def test_every_node_gets_the_same_prompt_rendezvous_settings(tmp_path):
    mesh = load_mesh(mesh_file(tmp_path, three_nodes()))
    confs = {}
    for node in mesh.nodes:
        argv = remote.torchrun_command(mesh, node, "1:3", 1, "r", 3, ["-m", "trainer"]).split()
        confs[node.name] = argv[argv.index("--rdzv-conf") + 1]
    timing = "keep_alive_interval=2,keep_alive_max_attempt=3,last_call_timeout=10"
    assert confs == {
        "hub": f"is_host=1,{timing}",
        "alice": f"is_host=0,{timing}",
        "bob": f"is_host=0,{timing}",
    }


FAKE_NVIDIA_SMI = """#!/bin/sh
echo "NVIDIA GeForce RTX 4090, 24564, 23012"
echo "NVIDIA GeForce RTX 4090, 24564, 1200"
"""


@pytest.fixture
def hosts(tmp_path):
    """Two SSH servers on 127.0.0.2 and 127.0.0.3; the second has a (fake) nvidia-smi."""
    key = paramiko.ECDSAKey.generate()
    key.write_private_key_file(str(tmp_path / "id_ecdsa"))
    gpu_bin = tmp_path / "gpu-bin"
    gpu_bin.mkdir()
    (gpu_bin / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (gpu_bin / "nvidia-smi").chmod(0o755)
    # No nvidia-smi on this machine's PATH: the first host is CPU-only, as a GPU-less peer is.
    cpu_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    servers = [
        LoopbackSshd(HOSTS[0], key, cpu_env),
        LoopbackSshd(HOSTS[1], key, cpu_env | {"PATH": f"{gpu_bin}:/usr/bin:/bin"}),
    ]
    yield servers, tmp_path / "id_ecdsa", write_known_hosts(tmp_path / "known_hosts", servers)
    for server in servers:
        server.close()


def loopback_mesh(tmp_path, hosts, extra_nodes=()) -> Path:
    servers, key_file, known_hosts = hosts
    with socket.create_server((HOSTS[0], 0)) as probe:
        rendezvous_port = probe.getsockname()[1]
    nodes = [
        {
            "name": name,
            "address": server.address,
            "interface": "lo",
            "ssh": {
                "host": server.address,
                "port": server.port,
                "user": "trainer",
                "keyFile": str(key_file),
            },
            "python": sys.executable,
            "workdir": str(ROOT),
        }
        for name, server in zip(["hub", "peer"], servers, strict=True)
    ]
    nodes[0]["endpoint"] = HOSTS[0]
    return mesh_file(
        tmp_path,
        {
            "network": "127.0.0.0/24",
            "coordinator": "hub",
            "rendezvousPort": rendezvous_port,
            "knownHosts": str(known_hosts),
            "nodes": nodes + list(extra_nodes),
        },
    )


def test_check_reports_gpus_cpu_only_and_unreachable_nodes(tmp_path, hosts):
    import torch

    servers, key_file, _ = hosts
    stranger = LoopbackSshd("127.0.0.4", servers[0].client_key, servers[0].env)  # unknown key
    try:
        extra = [
            {"name": "closed", "ssh": {"host": "127.0.0.5", "port": 9}},
            {
                "name": "stranger",
                "ssh": {"host": "127.0.0.4", "port": stranger.port, "keyFile": str(key_file)},
            },
        ]
        reports = remote.check_all(load_mesh(loopback_mesh(tmp_path, hosts, extra)))
    finally:
        stranger.close()
    cpu, gpu, closed, unknown = reports
    assert cpu.reachable and cpu.ready and cpu.gpus == [] and cpu.procs == 1
    assert cpu.torch == torch.__version__ and cpu.cuda == torch.version.cuda
    assert "CPU-only (no nvidia-smi GPUs)" in cpu.summary()
    assert gpu.gpus == [
        remote.Gpu("NVIDIA GeForce RTX 4090", 24564, 23012),
        remote.Gpu("NVIDIA GeForce RTX 4090", 24564, 1200),
    ]
    # GPUs but a torch that sees none (this machine's CPU wheel): flagged, not trained on.
    assert not gpu.ready and "sees no CUDA device" in gpu.problems[0]
    assert not closed.reachable and "Unable to connect to port 9" in closed.summary()
    assert not unknown.reachable and "not found in known_hosts" in unknown.summary()


def test_launch_trains_across_two_hosts_with_c10d_rendezvous(tmp_path, hosts, capsys):
    servers = hosts[0]
    servers[1].env["PATH"] = "/usr/bin:/bin"  # both CPU-only: the trainer runs on gloo
    metrics = tmp_path / "metrics.jsonl"
    code = cli.main(
        [
            "launch",
            str(loopback_mesh(tmp_path, hosts)),
            "--nnodes",
            "1:2",
            "--max-restarts",
            "0",
            "--",
            "-m",
            "trainer",
            "--steps",
            "6",
            "--global-batch",
            "8",
            "--micro-batch",
            "4",
            "--log-every",
            "2",
            "--checkpoint-every",
            "3",
            "--threads",
            "1",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--metrics",
            str(metrics),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "[hub] torchrun exited with 0" in out and "[peer] torchrun exited with 0" in out
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    start = next(r for r in records if r.get("event") == "start")
    assert start["world_size"] == 2
    assert any(r.get("event") == "done" for r in records)


@pytest.mark.parametrize("how", ["power_off", "freeze"])
def test_run_goes_on_without_a_node_that_leaves(tmp_path, hosts, capsys, monkeypatch, how):
    """--nnodes 1:2: the peer loses power (its connections close) or drops off the network (it
    stops answering) mid-run; the hub re-forms alone, resumes from the last checkpoint and
    finishes, and tp-mesh reports success with the peer as having left."""
    servers = hosts[0]
    servers[1].env["PATH"] = "/usr/bin:/bin"
    monkeypatch.setattr(remote, "FINISH_GRACE_SECONDS", 3.0)
    metrics = tmp_path / "metrics.jsonl"
    argv = ["launch", str(loopback_mesh(tmp_path, hosts)), "--nnodes", "1:2"]
    argv += ["--max-restarts", "1", "--", "-m", "trainer", "--steps", "12", "--global-batch"]
    argv += ["4", "--micro-batch", "2", "--checkpoint-every", "3", "--eval-every", "100"]
    argv += ["--threads", "1", "--checkpoint-dir", str(tmp_path / "ckpt")]
    argv += ["--metrics", str(metrics), "--collective-timeout", "5"]
    result = {}
    launcher = threading.Thread(target=lambda: result.setdefault("code", cli.main(argv)))
    launcher.start()

    def records() -> list[dict]:
        return [json.loads(line) for line in metrics.read_text().splitlines()]

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and launcher.is_alive():
        if metrics.exists() and any(r.get("event") == "checkpoint" for r in records()):
            break
        time.sleep(0.1)
    getattr(servers[1], how)()
    left_at = time.monotonic()
    launcher.join(timeout=180)
    out, err = capsys.readouterr()
    assert not launcher.is_alive() and result["code"] == 0, (out + err)[-4000:]
    assert "peer: left the run" in err
    if how == "freeze":
        assert "no answer 3 s after the run finished" in err

    first, *rest = records()
    assert first["event"] == "start" and first["world_size"] == 2
    assert first["resumed_from"] is None
    restart = next(i for i, r in enumerate(rest) if r.get("event") == "start")
    saved = [r["step"] for r in rest[:restart] if r.get("event") == "checkpoint"]
    assert rest[restart]["world_size"] == 1  # the hub alone, without the peer
    assert saved and rest[restart]["resumed_from"] == saved[-1] < 12
    assert rest[-1]["event"] == "done" and rest[-1]["step"] == 12
    print(f"re-formed and finished {time.monotonic() - left_at:.1f} s after the peer left")


def test_stop_ends_torchrun_on_every_host(tmp_path, hosts):
    servers = hosts[0]
    servers[1].env["PATH"] = "/usr/bin:/bin"
    mesh = load_mesh(loopback_mesh(tmp_path, hosts))
    script = [
        "-m",
        "trainer",
        "--steps",
        "100000",
        "--log-every",
        "1",
        "--threads",
        "1",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
    ]
    commands = {
        n.name: remote.torchrun_command(mesh, n, "2:2", 1, "stop-test", 0, script)
        for n in mesh.nodes
    }
    log = _Lines()
    job = remote.Launch(mesh, commands, out=log)
    job.start()
    try:
        deadline = time.monotonic() + 60
        while '"step": 2' not in log.text() and time.monotonic() < deadline:
            assert not job.wait(timeout=0.5), log.text()[-3000:]
        assert '"step": 2' in log.text(), log.text()[-3000:]
        job.stop()  # what Ctrl-C calls
    finally:
        job.close()
    assert set(job.exit_codes) == {"hub", "peer"}, log.text()[-3000:]
    assert all(code != 0 for code in job.exit_codes.values())


class _Lines:
    """A thread-safe stand-in for stdout."""

    def __init__(self):
        self._parts, self._lock = [], threading.Lock()

    def write(self, text):
        with self._lock:
            self._parts.append(text)

    def flush(self):
        pass

    def text(self):
        with self._lock:
            return "".join(self._parts)


def test_example_mesh_file_writes_configs(tmp_path, capsys):
    assert cli.main(["wireguard", str(ROOT / "mesh" / "example.yaml"), "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.conf")) == [
        "alice.conf",
        "bob.conf",
        "home.conf",
    ]
    assert "Endpoint = home.example.org:51820" in (tmp_path / "bob.conf").read_text()


def test_hub_forwards_between_spokes_when_the_forward_policy_is_drop(tmp_path, namespaces):
    """Three machines in network namespaces, real WireGuard brought up by wg-quick with the configs
    `tp-mesh wireguard` writes; the hub's FORWARD policy is DROP, as Docker and ufw leave it. A
    spoke reaches the other spoke through the hub thanks to the hub's PostUp rule, and without the
    rule it does not."""
    underlay = {"hub": "192.0.2.1", "s1": "192.0.2.2", "s2": "192.0.2.3"}
    document = {
        "network": "10.77.0.0/24",
        "coordinator": "hub",
        "nodes": [
            {"name": name, "ssh": {"host": address}} | ({"endpoint": address} if i == 0 else {})
            for i, (name, address) in enumerate(underlay.items())
        ],
    }
    assert cli.main(["wireguard", str(mesh_file(tmp_path, document)), "--out", str(tmp_path)]) == 0
    # What a user copies to /etc/wireguard/wg0.conf, under a name unique on this machine.
    configs = {}
    for name, address in underlay.items():
        namespaces.add(name, underlay=f"{address}/24")
        configs[name] = tmp_path / f"{namespaces.interface(name)}.conf"
        configs[name].write_text((tmp_path / f"{name}.conf").read_text())
        configs[name].chmod(0o600)
    hub, s1, s2 = (namespaces.ns(name) for name in underlay)
    namespaces.run(hub, "iptables", "-P", "FORWARD", "DROP")
    for name in underlay:
        namespaces.wg_quick(namespaces.ns(name), "up", configs[name])
    assert namespaces.reaches(s2, "10.77.0.1")  # each spoke's own session with the hub
    assert namespaces.reaches(s1, "10.77.0.3"), "spoke to spoke through the hub"
    interface = namespaces.interface("hub")
    rule = f"-A FORWARD -i {interface} -o {interface} -j ACCEPT"
    assert rule in namespaces.run(hub, "iptables", "-S", "FORWARD").stdout.splitlines()
    # The hub as it was before the rule: the spokes reach it, not each other.
    namespaces.run(hub, "iptables", "-D", *rule.split()[1:])
    assert namespaces.reaches(s1, "10.77.0.1")
    assert not namespaces.reaches(s1, "10.77.0.3", attempts=2)
    namespaces.run(hub, "iptables", *rule.split())
    assert namespaces.reaches(s1, "10.77.0.3")
    # wg-quick down runs PostDown: the rule goes with the interface.
    namespaces.wg_quick(hub, "down", configs["hub"])
    assert rule not in namespaces.run(hub, "iptables", "-S", "FORWARD").stdout
