"""tp-mesh: WireGuard configs, SSH checks, and a torchrun launch across machines outside AWS.

tp-mesh keygen                                 on each machine: its private key, prints the public
tp-mesh wireguard mesh.yaml --out build/mesh   one .conf per node (no private keys in them)
tp-mesh check mesh.yaml                        reachability, GPUs and free memory, torch/CUDA
tp-mesh launch mesh.yaml --nnodes 2:3 --workdir . --setup "pip install -r requirements.txt" \\
    -- -m trainer --steps 2000 --checkpoint-dir s3://b/p
"""

import argparse
import logging
import os
import re
import sys
from pathlib import Path

from mesh import remote
from mesh.layout import wireguard_configs
from mesh.spec import Mesh, MeshError, load_mesh
from mesh.wireguard import generate_private_key, public_key
from mesh.workdir import DEFAULT_EXCLUDES, DEFAULT_MAX_MB, Archive, pack


def keygen(key_file: Path) -> str:
    """This machine's WireGuard private key, made once (mode 0600) and kept; its public key."""
    try:
        key_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # O_EXCL: never over an existing key, whose public key is in mesh files already.
        descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = key_file.stat().st_mode & 0o777
        if mode & 0o077:
            raise MeshError(
                f"{key_file} holds a private key others can read (mode {mode:o}); allowed: 600 "
                f"(chmod 600 {key_file})"
            ) from None
        try:
            return public_key(key_file.read_text().strip())
        except ValueError as e:
            raise MeshError(f"{key_file}: {e}") from None
    except PermissionError as e:
        raise MeshError(
            f"cannot write {key_file} ({e.strerror}): run it as root (sudo), or pass --key-file "
            "with a path you can write and set the node's privateKeyFile to it"
        ) from None
    private = generate_private_key()
    with os.fdopen(descriptor, "w") as out:
        out.write(private + "\n")
    return public_key(private)


def write_configs(mesh: Mesh, out: Path) -> list[Path]:
    configs = wireguard_configs(mesh)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in configs.items():
        path = out / f"{name}.conf"
        path.touch(mode=0o600)  # wg-quick warns about configs others can read
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


def run_everywhere(job: remote.Launch, give_up_on_silent: bool) -> list[str] | None:
    """Runs job on its nodes to the end: the nodes still silent FINISH_GRACE_SECONDS after one
    finished (give_up_on_silent), or None when Ctrl-C stopped them all."""
    job.start()
    silent: list[str] = []
    try:
        while not job.wait(timeout=0.5) and not (give_up_on_silent and (silent := job.silent())):
            pass
    except KeyboardInterrupt:
        job.stop()
        return None
    finally:
        job.close()
    return silent


def prepare(mesh: Mesh, archive: Archive | None, setup: str | None) -> int:
    """The workdir copied to and the setup run on every node SSH reaches, before the launch:
    0, or the launch stops (a node where either failed is named)."""
    if archive is not None:
        at_home = [n.name for n in mesh.nodes if n.workdir == "~"]
        if at_home:
            raise MeshError(
                f"--workdir: nodes {', '.join(at_home)} have the home directory as workdir; "
                "allowed: a folder of its own for the copied files (nodes[].workdir: ~/tp)"
            )
    prepared = remote.prepare_workdirs(mesh, archive.data if archive else None)
    for node in mesh.nodes:
        if node.name not in prepared:
            print(f"{node.name}: unreachable over SSH, left out (the check says why)")
        elif prepared[node.name]:
            print(f"{node.name}: workdir {node.workdir} {prepared[node.name]}", file=sys.stderr)
        elif archive is not None:
            print(f"{node.name}: copied {archive.summary()} to {node.workdir}")
    if any(prepared.values()):
        print("nothing launched", file=sys.stderr)
        return 1
    if setup is None:
        return 0
    commands = {name: remote.setup_command(mesh.node(name), setup) for name in prepared}
    job = remote.Launch(mesh, commands, what="setup", group=True)
    if run_everywhere(job, give_up_on_silent=False) is None:
        return 130
    failed = {name: code for name, code in job.exit_codes.items() if code != 0}
    for name, code in failed.items():
        print(f"setup failed on {name} (exit {code}): nothing launched", file=sys.stderr)
    return 1 if failed else 0


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
    silent = run_everywhere(job, give_up_on_silent=True)
    if silent is None:
        return 130
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
                else remote.ending("torchrun", code)
            )
            print(f"{name}: {role} ({how})", file=sys.stderr)
    return 0 if len(finished) >= low else 1


MESH_HELP = "the mesh file (YAML: network, coordinator, nodes; see mesh/example.yaml)"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tp-mesh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    key = commands.add_parser(
        "keygen", help="on a machine: make its WireGuard private key, print the public key"
    )
    key.add_argument(
        "--key-file",
        type=Path,
        default=Path("/etc/wireguard/wg0.key"),
        help="where the private key is kept; an existing key is reused (default: %(default)s)",
    )
    wg = commands.add_parser("wireguard", help="write each node's WireGuard config")
    wg.add_argument("mesh", type=Path, help=MESH_HELP)
    wg.add_argument(
        "--out",
        type=Path,
        default=Path("build/mesh"),
        help="folder for the <node>.conf files (default: %(default)s)",
    )
    check = commands.add_parser("check", help="check every node over SSH")
    check.add_argument("mesh", type=Path, help=MESH_HELP)
    run = commands.add_parser(
        "launch", help="torchrun on every ready node; torchrun's script and arguments after --"
    )
    run.add_argument("mesh", type=Path, help=MESH_HELP)
    run.add_argument("--nnodes", required=True, help="N, or MIN:MAX for an elastic run")
    run.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="worker-group restarts per node; each node that leaves uses one on every survivor "
        "(default: %(default)s)",
    )
    run.add_argument("--run-id", default=None, help="rendezvous id (default: a new one)")
    run.add_argument(
        "--workdir",
        type=Path,
        help="a local folder to copy into every node's workdir first (default: copy nothing)",
    )
    run.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help=f"leave out of --workdir, besides {', '.join(DEFAULT_EXCLUDES)} (repeatable; "
        "default: nothing more)",
    )
    run.add_argument(
        "--max-workdir-mb",
        type=int,
        default=DEFAULT_MAX_MB,
        help="refuse a --workdir larger than this many MiB (default: %(default)s)",
    )
    run.add_argument(
        "--setup",
        help="a shell command run in every node's workdir first (default: none)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    # What follows `--` is torchrun's script and its arguments, untouched by this parser.
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    argv, script = argv[:split], argv[split + 1 :]
    args = parser().parse_args(argv)
    # paramiko logs each failed connection with a traceback; the node report already says why.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    try:
        if args.command == "keygen":
            print(keygen(args.key_file))
            print(
                f"private key: {args.key_file} (mode 600, stays here); put the public key above "
                "in the mesh file as this node's publicKey",
                file=sys.stderr,
            )
            return 0
        mesh = load_mesh(args.mesh)
        if args.command == "wireguard":
            if mesh.on_tailnet:
                print("network: tailnet: the machines are on a tailnet already; no WireGuard")
                return 0
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
        parse_nnodes(args.nnodes, len(mesh.nodes))
        if args.workdir is not None or args.setup is not None:
            archive = None
            if args.workdir is not None:
                excludes = (*DEFAULT_EXCLUDES, *args.exclude)
                archive = pack(args.workdir, excludes, args.max_workdir_mb)
            code = prepare(mesh, archive, args.setup)
            if code:
                return code
        return launch(
            mesh, args.nnodes, args.max_restarts, script, args.run_id or remote.new_run_id()
        )
    except MeshError as e:
        print(e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
