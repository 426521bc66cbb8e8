"""tp-mesh: keys and WireGuard configs, the mesh file's validation, and SSH checks, the workdir and
setup, and a torchrun launch of the real trainer against two SSH servers on loopback addresses
standing in for two machines. Real networks in namespaces: tests/integration/test_mesh_netns.py."""

import base64
import io
import ipaddress
import json
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from mesh import cli, remote
from mesh.spec import MeshError, load_mesh
from mesh.wireguard import decode_key, generate_private_key, public_key
from mesh.workdir import pack
from tests.openssh import SYSTEM_PATH, Host, OpenSsh
from tests.plugin import ROOT
from trainer.data import DEFAULT_TOKENS, ensure_default_tokens

HOSTS = ["127.0.0.2", "127.0.0.3"]
NODES = ["hub", "peer"]


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


def test_keygen_keeps_the_private_key_on_its_machine_and_prints_the_public_key(tmp_path, capsys):
    key_file = tmp_path / "etc" / "wireguard" / "wg0.key"
    assert cli.main(["keygen", "--key-file", str(key_file)]) == 0
    out, err = capsys.readouterr()
    private = key_file.read_text().strip()
    wg_pubkey = subprocess.run(["wg", "pubkey"], input=private, capture_output=True, text=True)
    assert out == wg_pubkey.stdout  # the public key alone, as WireGuard's own tool derives it
    assert private not in out + err
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    # Run again: the same key, whose public key may be in mesh files already.
    assert cli.main(["keygen", "--key-file", str(key_file)]) == 0
    assert capsys.readouterr().out == wg_pubkey.stdout
    key_file.chmod(0o640)
    assert cli.main(["keygen", "--key-file", str(key_file)]) == 2
    assert "others can read (mode 640); allowed: 600" in capsys.readouterr().err


def four_nodes() -> dict:
    """hub and alice with endpoints, bob and carol behind NAT without; keys from keygen."""
    keys = {name: public_key(generate_private_key()) for name in ("hub", "alice", "bob", "carol")}
    document = three_nodes()
    document["nodes"][1]["endpoint"] = "alice.example.org"
    document["nodes"].append({"name": "carol", "ssh": {"host": "carol.lan"}})
    for node in document["nodes"]:
        node["publicKey"] = keys[node["name"]]
    document["nodes"][3]["privateKeyFile"] = "/home/carol/wg key"
    return document


def test_configs_are_a_full_mesh_between_endpoints_with_the_hub_for_the_rest(tmp_path):
    document = four_nodes()
    keys = {n["name"]: n["publicKey"] for n in document["nodes"]}
    mesh = load_mesh(mesh_file(tmp_path, document))
    assert {k: str(v) for k, v in mesh.addresses().items()} == {
        "hub": "10.77.0.1",
        "alice": "10.77.0.2",
        "bob": "10.77.0.9",
        "carol": "10.77.0.3",
    }
    paths = cli.write_configs(mesh, tmp_path / "out")
    configs = {p.stem: (tmp_path / "out" / f"{p.stem}.conf").read_text() for p in paths}
    hub, *hub_peers = sections(configs["hub"])
    key = "wg set %i private-key /etc/wireguard/wg0.key"
    assert hub == {
        "section": "Interface",
        "Address": "10.77.0.1/24",
        "ListenPort": "51820",
        "PostUp": [
            f"{key} peer {keys['alice']} persistent-keepalive 25",
            "sysctl -w net.ipv4.ip_forward=1",
            "iptables -A FORWARD -i %i -o %i -j ACCEPT",
        ],
        "PostDown": "iptables -D FORWARD -i %i -o %i -j ACCEPT",
    }
    assert hub_peers == [
        {
            "section": "Peer",
            "PublicKey": keys["alice"],
            "Endpoint": "alice.example.org:51820",
            "AllowedIPs": "10.77.0.2/32",
        },
        {"section": "Peer", "PublicKey": keys["bob"], "AllowedIPs": "10.77.0.9/32"},
        {"section": "Peer", "PublicKey": keys["carol"], "AllowedIPs": "10.77.0.3/32"},
    ]
    alice, *alice_peers = sections(configs["alice"])
    assert alice == {
        "section": "Interface",
        "Address": "10.77.0.2/24",
        "ListenPort": "51820",
        "PostUp": f"{key} peer {keys['hub']} persistent-keepalive 25",
    }
    # Bob and carol are reached through the hub: in its AllowedIPs and no other peer's.
    assert alice_peers == [
        {
            "section": "Peer",
            "PublicKey": keys["hub"],
            "Endpoint": "hub.example.org:51820",
            "AllowedIPs": "10.77.0.1/32, 10.77.0.9/32, 10.77.0.3/32",
        }
    ]
    assert sections(configs["carol"]) == [
        {
            "section": "Interface",
            "Address": "10.77.0.3/24",
            "PostUp": "wg set %i private-key '/home/carol/wg key' peer "
            f"{keys['hub']} persistent-keepalive 25",
        },
        {
            "section": "Peer",
            "PublicKey": keys["hub"],
            "Endpoint": "hub.example.org:51820",
            "AllowedIPs": "10.77.0.0/24",
        },
    ]
    # WireGuard sends each packet to the one peer whose AllowedIPs hold its destination
    # (wireguard.com/#cryptokey-routing): in every config, each other node is in exactly one.
    addresses = mesh.addresses()
    for name, config in configs.items():
        allowed = [
            [ipaddress.IPv4Network(n) for n in peer["AllowedIPs"].split(", ")]
            for peer in sections(config)[1:]
        ]
        for other, address in addresses.items():
            holders = [nets for nets in allowed if any(address in n for n in nets)]
            assert other == name or len(holders) == 1, (name, other)
        assert "PrivateKey" not in config
    for path in paths:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_a_mesh_file_without_public_keys_says_how_to_make_them(tmp_path, capsys):
    assert cli.main(["wireguard", str(mesh_file(tmp_path, three_nodes()))]) == 2
    err = capsys.readouterr().err
    assert "nodes hub, alice, bob have no publicKey" in err and "tp-mesh keygen" in err


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
        ({"network": "tailscale"}, "network: 'tailscale': allowed: an IPv4 network"),
        ({"network": "tailnet"}, "node hub: address (none) is not a tailnet address; allowed"),
        (
            {
                "network": "tailnet",
                "nodes": [{"name": "hub", "address": "10.1.2.3", "ssh": {"host": "h"}}],
            },
            "node hub: address 10.1.2.3 is not a tailnet address; allowed: its address in "
            "100.64.0.0/10 or fd7a:115c:a1e0::/48",
        ),
        (
            {
                "network": "tailnet",
                "nodes": [
                    {"name": "hub", "address": "100.64.1.1", "endpoint": "x", "ssh": {"host": "h"}}
                ],
            },
            "node hub: endpoint set, but network is tailnet",
        ),
        (
            {
                "network": "tailnet",
                "nodes": [
                    {"name": "hub", "address": "100.64.1.1", "ssh": {"host": "h"}},
                    {"name": "bob", "address": "fd7a:115c:a1e0::2", "ssh": {"host": "b"}},
                ],
            },
            "addresses mix IPv4 and IPv6",
        ),
        (
            {
                "nodes": [
                    {**n, "publicKey": "VNgSge75WmTmTcg71NvFgRrCYtyxp7FCBOPiBFatZXI="}
                    for n in three_nodes()["nodes"]
                ]
            },
            "nodes hub, alice, bob have the same publicKey",
        ),
        (
            {"nodes": [{**three_nodes()["nodes"][0], "publicKey": "abc"}]},
            "nodes.0.publicKey: not a WireGuard key",
        ),
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


def test_tailnet_nodes_use_their_tailnet_address_and_tailscale0(tmp_path):
    document = {
        "network": "tailnet",
        "coordinator": "hub",
        "nodes": [
            {"name": "hub", "address": "fd7a:115c:a1e0::1", "ssh": {"host": "hub"}},
            {
                "name": "mac",
                "address": "fd7a:115c:a1e0::2",
                "interface": "utun4",
                "ssh": {"host": "m"},
            },
        ],
    }
    mesh = load_mesh(mesh_file(tmp_path, document))
    for node, interface in zip(mesh.nodes, ["tailscale0", "utun4"], strict=True):
        command = remote.torchrun_command(mesh, node, "2", 1, "r", 0, ["-m", "trainer"])
        assert f"GLOO_SOCKET_IFNAME={interface} NCCL_SOCKET_IFNAME={interface}" in command
        argv = shlex.split(command)
        assert argv[argv.index("--rdzv-endpoint") + 1] == "[fd7a:115c:a1e0::1]:29400"
        assert argv[argv.index("--local-addr") + 1] == str(node.address)


FAKE_NVIDIA_SMI = """#!/bin/sh
echo "NVIDIA GeForce RTX 4090, 24564, 23012"
echo "NVIDIA GeForce RTX 4090, 24564, 1200"
"""


@pytest.fixture
def site():
    """Real OpenSSH (tests/openssh.py): the tp-mesh user's key and known_hosts, and its hosts."""
    ensure_default_tokens(ROOT / DEFAULT_TOKENS)  # read by the trainer, which may not write there
    with OpenSsh() as site:
        yield site


@pytest.fixture
def hosts(site) -> list[Host]:
    """Two CPU-only machines: sshd on 127.0.0.2 and 127.0.0.3."""
    return [site.serve(name, address) for name, address in zip(NODES, HOSTS, strict=True)]


def loopback_mesh(
    site: OpenSsh, hosts: list[Host], extra_nodes=(), workdirs: dict[str, Path] | None = None
) -> Path:
    """A mesh file for `hosts` as a user writes it: the account as SSH user, the client key and
    the known_hosts the fixture wrote (OpenSSH's format, which paramiko reads)."""
    with socket.create_server((HOSTS[0], 0)) as probe:
        rendezvous_port = probe.getsockname()[1]
    nodes = [
        {
            "name": name,
            "address": host.address,
            "interface": "lo",
            "ssh": {
                "host": host.address,
                "port": host.port,
                "user": site.account.name,
                "keyFile": str(site.client_key),
            },
            "python": sys.executable,
            "workdir": str((workdirs or {}).get(name, ROOT)),
        }
        for name, host in zip(NODES, hosts, strict=True)
    ]
    nodes[0]["endpoint"] = HOSTS[0]
    return mesh_file(
        site.mkdir("mesh"),
        {
            "network": "127.0.0.0/24",
            "coordinator": "hub",
            "rendezvousPort": rendezvous_port,
            "knownHosts": str(site.known_hosts),
            "nodes": nodes + list(extra_nodes),
        },
    )


def test_check_reports_gpus_cpu_only_and_unreachable_nodes(site):
    import torch

    # The peer has GPUs: an nvidia-smi on its sessions' PATH.
    gpu_bin = site.mkdir("gpu-bin")
    site.write(gpu_bin / "nvidia-smi", FAKE_NVIDIA_SMI).chmod(0o755)
    hosts = [
        site.serve("hub", HOSTS[0]),
        site.serve("peer", HOSTS[1], env={"PATH": f"{gpu_bin}:{SYSTEM_PATH}"}),
    ]
    with OpenSsh() as elsewhere:  # a host whose key this known_hosts has never seen
        stranger = elsewhere.serve("stranger", "127.0.0.4")
        extra = [
            {"name": "closed", "ssh": {"host": "127.0.0.5", "port": 9}},
            {
                "name": "stranger",  # let in but for its host key
                "ssh": {
                    "host": stranger.address,
                    "port": stranger.port,
                    "user": elsewhere.account.name,
                    "keyFile": str(elsewhere.client_key),
                },
            },
        ]
        reports = remote.check_all(load_mesh(loopback_mesh(site, hosts, extra)))
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


def workdir_source(tmp_path: Path) -> Path:
    """A project to copy: what it needs, and what stays behind (.git, a build, an --exclude)."""
    source = tmp_path / "project"
    for path, text in {
        "setup.sh": 'echo "setting up in $PWD"; cp data/notes.txt setup-done\n',
        "data/notes.txt": "notes\n",
        ".git/HEAD": "ref: refs/heads/main\n",
        "build/big.bin": "x" * 4096,
        "scratch.tmp": "scratch\n",
    }.items():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_text(text)
    return source


def test_launch_copies_the_workdir_runs_setup_and_trains_across_two_hosts(
    tmp_path, site, hosts, capsys
):
    """The workdir (a project with the trainer in it) copied to both hosts and the setup run on
    both before torchrun starts the copied trainer on each, meeting through c10d."""
    source = workdir_source(tmp_path)
    shutil.copytree(
        ROOT / "trainer", source / "trainer", ignore=shutil.ignore_patterns("__pycache__")
    )
    left_behind = {".git/HEAD", "build/big.bin", "scratch.tmp"}
    copied = {str(f.relative_to(source)) for f in source.rglob("*") if f.is_file()} - left_behind
    workdirs = {name: site.dir / f"{name}-tp" for name in NODES}
    run = site.mkdir("run")
    argv = ["launch", str(loopback_mesh(site, hosts, workdirs=workdirs))]
    argv += ["--nnodes", "1:2", "--max-restarts", "0"]
    argv += ["--workdir", str(source), "--exclude", "*.tmp"]
    argv += ["--setup", "sh setup.sh", "--", "-m", "trainer", "--steps", "6"]
    argv += ["--global-batch", "8", "--micro-batch", "4", "--log-every", "2"]
    argv += ["--checkpoint-every", "3", "--threads", "1"]
    argv += ["--checkpoint-dir", str(run / "ckpt"), "--metrics", str(run / "metrics.jsonl")]
    code = cli.main(argv)
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    for name, workdir in workdirs.items():
        assert f"{name}: copied {len(copied)} files, 0.1 MiB to {workdir}" in out
        assert {f for f in copied | left_behind if (workdir / f).exists()} == copied
        assert (workdir / "setup-done").read_text() == "notes\n"
        assert f"[{name}] setting up in {workdir}" in out
        assert f"[{name}] setup exited with 0" in out
    assert out.index("setup exited") < out.index("launching run")
    assert "[hub] torchrun exited with 0" in out and "[peer] torchrun exited with 0" in out
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    start = next(r for r in records if r.get("event") == "start")
    assert start["world_size"] == 2
    assert any(r.get("event") == "done" for r in records)


def test_a_failing_setup_stops_the_launch_naming_the_node(site, hosts, capsys):
    workdirs = {name: site.dir / f"{name}-tp" for name in NODES}
    site.write(site.mkdir("peer-tp") / "BROKEN", "")
    setup = "if [ -e BROKEN ]; then echo 'no CUDA driver here' >&2; exit 3; fi; touch setup-done"
    argv = ["launch", str(loopback_mesh(site, hosts, workdirs=workdirs)), "--nnodes", "2"]
    assert cli.main([*argv, "--setup", setup, "--", "-m", "trainer"]) == 1
    out, err = capsys.readouterr()
    assert "[peer] no CUDA driver here" in out and "[peer] setup exited with 3" in out
    assert "setup failed on peer (exit 3): nothing launched" in err
    assert (workdirs["hub"] / "setup-done").exists()  # made by --setup alone, then set up
    assert "launching run" not in out


def test_stopping_a_setup_stops_what_it_started(site, hosts, monkeypatch):
    """Ctrl-C during the setup: each node's setup shell and its children (a pip install; here a
    sleep holding the output open) end, not the shell alone: well within the grace after which
    what is left would be killed."""
    monkeypatch.setattr(remote, "STOP_GRACE_SECONDS", 20.0)
    mesh = load_mesh(loopback_mesh(site, hosts))
    commands = {n.name: remote.setup_command(n, "echo started; sleep 30") for n in mesh.nodes}
    log = _Lines()
    job = remote.Launch(mesh, commands, out=log, what="setup", group=True)
    job.start()
    try:
        deadline = time.monotonic() + 30
        while log.text().count("started") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        began = time.monotonic()
        job.stop()
    finally:
        job.close()
    assert set(job.exit_codes) == {"hub", "peer"}, log.text()
    assert time.monotonic() - began < remote.STOP_GRACE_SECONDS / 2


def test_workdir_over_the_size_limit_or_into_a_home_directory_is_refused(tmp_path, capsys):
    source = workdir_source(tmp_path)
    (source / "data" / "shard.bin").write_bytes(b"\0" * (2 * 1024 * 1024))
    mesh = str(mesh_file(tmp_path, three_nodes()))
    argv = ["launch", mesh, "--nnodes", "1", "--workdir", str(source), "--max-workdir-mb", "1"]
    assert cli.main([*argv, "--", "train.py"]) == 2
    assert (
        f"--workdir {source}: 2.0 MiB in 4 files, over the 1 MiB limit; largest: data/ 2.0 MiB, "
        "setup.sh 0.0 MiB, scratch.tmp 0.0 MiB. Leave parts out with --exclude NAME, or raise "
        "--max-workdir-mb"
    ) in capsys.readouterr().err
    # Left out, it fits; the nodes' workdir is their home directory, where it does not go.
    assert cli.main([*argv, "--exclude", "shard.bin", "--", "train.py"]) == 2
    assert "nodes hub, alice, bob have the home directory as workdir" in capsys.readouterr().err
    # The same files make the same archive.
    assert pack(source, (".git",), 10).data == pack(source, (".git",), 10).data


def test_sockets_and_pipes_in_the_workdir_are_left_out_and_named(tmp_path):
    """A notebook kernel's socket or a named pipe beside the code: not files, and not copied
    (red before: tarfile has no member for them, and packing failed with AttributeError)."""
    source = workdir_source(tmp_path)
    os.mkfifo(source / "data" / "feed")
    with socket.socket(socket.AF_UNIX) as kernel:
        kernel.bind(str(source / "kernel.sock"))
        archive = pack(source, (".git", "build"), 10)
    assert archive.left_out == ("data/feed", "kernel.sock")
    assert archive.summary().endswith("(left out, not files: data/feed, kernel.sock)")
    with tarfile.open(fileobj=io.BytesIO(archive.data)) as tar:
        assert set(tar.getnames()) == set(archive.entries)
    assert "kernel.sock" not in archive.entries and "data/notes.txt" in archive.entries


@pytest.mark.parametrize("how", ["power_off", "freeze"])
def test_run_goes_on_without_a_node_that_leaves(site, hosts, capsys, monkeypatch, how):
    """--nnodes 1:2: the peer loses power (its connections close) or drops off the network (it
    stops answering) mid-run; the hub re-forms alone, resumes from the last checkpoint and
    finishes, and tp-mesh reports success with the peer as having left."""
    monkeypatch.setattr(remote, "FINISH_GRACE_SECONDS", 3.0)
    run = site.mkdir("run")
    metrics = run / "metrics.jsonl"
    argv = ["launch", str(loopback_mesh(site, hosts)), "--nnodes", "1:2"]
    # The peer leaves after the first checkpoint (step 3): the steps after it are the margin for
    # a test thread that the machine starves meanwhile.
    argv += ["--max-restarts", "1", "--", "-m", "trainer", "--steps", "30", "--global-batch"]
    argv += ["4", "--micro-batch", "2", "--checkpoint-every", "3", "--eval-every", "100"]
    argv += ["--threads", "1", "--checkpoint-dir", str(run / "ckpt")]
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
    getattr(hosts[1], how)()  # every process of the peer: its sshd, torchrun and workers
    left_at = time.monotonic()
    launcher.join(timeout=180)
    out, err = capsys.readouterr()
    assert not launcher.is_alive() and result["code"] == 0, (out + err)[-4000:]
    if how == "power_off":  # its sshd gone, no exit status came
        assert "peer: left the run (torchrun ended without an exit status" in err
    else:
        assert "peer: left the run (no answer 3 s after the run finished)" in err

    first, *rest = records()
    assert first["event"] == "start" and first["world_size"] == 2
    assert first["resumed_from"] is None
    restart = next(i for i, r in enumerate(rest) if r.get("event") == "start")
    saved = [r["step"] for r in rest[:restart] if r.get("event") == "checkpoint"]
    assert rest[restart]["world_size"] == 1  # the hub alone, without the peer
    assert saved and rest[restart]["resumed_from"] == saved[-1] < 30
    assert rest[-1]["event"] == "done" and rest[-1]["step"] == 30
    print(f"re-formed and finished {time.monotonic() - left_at:.1f} s after the peer left")


def test_stop_ends_torchrun_on_every_host(site, hosts):
    mesh = load_mesh(loopback_mesh(site, hosts))
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
        str(site.mkdir("ckpt")),
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


def test_example_mesh_files(tmp_path, capsys):
    assert cli.main(["wireguard", str(ROOT / "mesh" / "example.yaml"), "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.conf")) == [
        "alice.conf",
        "bob.conf",
        "home.conf",
    ]
    assert "Endpoint = home.example.org:51820" in (tmp_path / "bob.conf").read_text()
    assert "Endpoint = alice.example.org:51820" in (tmp_path / "home.conf").read_text()
    capsys.readouterr()
    tailnet = ROOT / "mesh" / "example-tailnet.yaml"
    assert cli.main(["wireguard", str(tailnet), "--out", str(tmp_path / "t")]) == 0
    assert "no WireGuard" in capsys.readouterr().out
