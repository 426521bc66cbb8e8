"""tp-mesh: WireGuard configs, SSH checks and a torchrun launch across machines outside AWS.

tp-mesh wireguard mesh.yaml --out build/mesh   keys (kept across runs) and one .conf per node
tp-mesh check mesh.yaml                        reachability, GPUs and free memory, torch/CUDA
tp-mesh launch mesh.yaml --nnodes 2:3 -- -m trainer --steps 2000 --checkpoint-dir s3://b/p
"""

import argparse
import logging
import re
import sys
from pathlib import Path

from mesh import remote
from mesh.spec import Mesh, MeshError, load_mesh
from mesh.wireguard import Hub, Spoke, generate_private_key, hub_config, spoke_config


def node_keys(mesh: Mesh, key_dir: Path) -> dict[str, str]:
    """Each node's private key, generated once into key_dir and reused: configs stay stable."""
    key_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    keys = {}
    for node in mesh.nodes:
        path = key_dir / f"{node.name}.key"
        if not path.exists():
            path.touch(mode=0o600)
            path.write_text(generate_private_key() + "\n")
        keys[node.name] = path.read_text().strip()
    return keys


def wireguard_configs(mesh: Mesh, keys: dict[str, str]) -> dict[str, str]:
    """node name -> its wg-quick config: the coordinator is the hub, every other node a spoke."""
    addresses = mesh.addresses()
    coordinator = mesh.node(mesh.coordinator)
    hub = Hub(
        private_key=keys[coordinator.name],
        address=addresses[coordinator.name],
        endpoint=coordinator.endpoint,
        listen_port=mesh.listen_port,
    )
    spokes = [
        Spoke(n.name, keys[n.name], addresses[n.name])
        for n in mesh.nodes
        if n.name != coordinator.name
    ]
    configs = {coordinator.name: hub_config(hub, mesh.network, spokes)}
    configs |= {s.name: spoke_config(hub, mesh.network, s) for s in spokes}
    return configs


def write_configs(mesh: Mesh, out: Path) -> list[Path]:
    configs = wireguard_configs(mesh, node_keys(mesh, out / "keys"))
    paths = []
    for name, text in configs.items():
        path = out / f"{name}.conf"
        path.touch(mode=0o600)  # holds a private key
        path.write_text(text)
        paths.append(path)
    return paths


def parse_nnodes(value: str, nodes: int) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)(?::(\d+))?", value)
    low, high = (int(match[1]), int(match[2] or match[1])) if match else (0, 0)
    if not 1 <= low <= high <= nodes:
        raise MeshError(
            f"--nnodes {value}: allowed: N or MIN:MAX with 1 <= MIN <= MAX <= {nodes} "
            "(the nodes in the mesh file)"
        )
    return low, high


def launch(mesh: Mesh, nnodes: str, max_restarts: int, script: list[str], run_id: str) -> int:
    low, high = parse_nnodes(nnodes, len(mesh.nodes))
    reports = remote.check_all(mesh)
    for report in reports:
        print(report.summary())
    ready = {r.node: r for r in reports if r.ready}
    if mesh.coordinator not in ready:
        print(f"coordinator {mesh.coordinator} is not ready: nothing launched", file=sys.stderr)
        return 1
    if len(ready) < low:
        print(f"{len(ready)} node(s) ready, --nnodes needs at least {low}", file=sys.stderr)
        return 1
    commands = {
        name: remote.torchrun_command(
            mesh, mesh.node(name), f"{low}:{high}", report.procs, run_id, max_restarts, script
        )
        for name, report in ready.items()
    }
    print(
        f"launching run {run_id} on {', '.join(commands)} (rendezvous "
        f"{mesh.rendezvous_endpoint()}); Ctrl-C stops every node"
    )
    job = remote.Launch(mesh, commands)
    job.start()
    silent: list[str] = []
    try:
        while not job.wait(timeout=0.5) and not (silent := job.silent()):
            pass
    except KeyboardInterrupt:
        job.stop()
        return 130
    finally:
        job.close()
    return outcome({**job.exit_codes, **dict.fromkeys(silent)}, low)


def outcome(exit_codes: dict[str, int | None], low: int) -> int:
    """0 when at least MIN nodes finished: in an elastic run a node that left (a non-zero exit,
    or no answer at all) did not stop the others, which re-formed without it and resumed from
    the checkpoint."""
    finished = [n for n, c in exit_codes.items() if c == 0]
    for name, code in exit_codes.items():
        if code != 0:
            role = "left the run" if len(finished) >= low else "failed"
            how = (
                f"no answer {remote.FINISH_GRACE_SECONDS:.0f} s after the run finished"
                if code is None
                else f"torchrun exited with {code}"
            )
            print(f"{name}: {role} ({how})", file=sys.stderr)
    return 0 if len(finished) >= low else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tp-mesh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    wg = commands.add_parser("wireguard", help="write WireGuard hub-and-spoke configs")
    wg.add_argument("mesh", type=Path)
    wg.add_argument("--out", type=Path, default=Path("build/mesh"))
    check = commands.add_parser("check", help="check every node over SSH")
    check.add_argument("mesh", type=Path)
    run = commands.add_parser("launch", help="torchrun on every ready node")
    run.add_argument("mesh", type=Path)
    run.add_argument("--nnodes", required=True, help="N, or MIN:MAX for an elastic run")
    run.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="worker-group restarts per node; each node that leaves uses one on every survivor",
    )
    run.add_argument("--run-id", default=None, help="rendezvous id (default: a new one)")
    # What follows `--` is torchrun's script and its arguments, untouched by this parser.
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    argv, script = argv[:split], argv[split + 1 :]
    args = parser.parse_args(argv)
    # paramiko logs each failed connection with a traceback; the node report already says why.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    try:
        mesh = load_mesh(args.mesh)
        if args.command == "wireguard":
            for path in write_configs(mesh, args.out):
                print(f"wrote {path}")
            return 0
        if args.command == "check":
            reports = remote.check_all(mesh)
            for report in reports:
                print(report.summary())
            return 0 if all(r.ready for r in reports) else 1
        if not script:
            raise MeshError("launch: nothing to run; allowed: -- followed by torchrun's script")
        return launch(
            mesh, args.nnodes, args.max_restarts, script, args.run_id or remote.new_run_id()
        )
    except MeshError as e:
        print(e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
