"""devctl: create, reach and drive your DevServers, and see how your team's jobs fare
(installed as a console script by the project).

    devctl create box --flavor gpu-1 [--distributed --replicas 2] [--dry-run -o yaml]
    devctl list [--homes] | ssh box [--replica 1] | ssh-config | monitor box
    devctl run box train.py --steps 100      (syncs the working directory, torchruns on every pod)
    devctl submit --pool gpu-small --nodes 2 -- train.py   (your folder as a job; --local: here)
    devctl logs job [--node 1] [-f] | fetch job [outputs]   (what your team's job printed, made)
    devctl keep box 2h | stop box | start box | delete box [--delete-home]
    devctl status [job] -n <team>            (the team's jobs: queued and why, running, finished)
    devctl savings [--since 7d] [--all-namespaces]   (what idle stops saved, per user)
    devctl usage [--since 7d] [-A] [--format csv]    (GPU-hours and dollars per job, user, team)

It talks to the cluster with the kubernetes Python client and your kubeconfig (the namespace is
dev-<you>, for `status` your team's: --namespace, else the kubeconfig context's), never
kubectl: `ssh` and the entries `ssh-config` writes run your ssh through `devctl proxy`, a tunnel
through the API server's port-forward (devservers.ssh); `run` execs through the API server
(devservers.run).
`create --dry-run` needs no cluster: what the cluster would tell it comes from the stack file
(devservers.stack_defaults).
"""

import argparse
import os
import re
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

from devservers.activity import parse_duration
from devservers.api import (
    API_VERSION,
)
from devservers.devctl import (
    CliError,
    Devctl,
    add_dry_run_options,
    kube_namespace,
    print_manifest,
)
from devservers.render import owner_of_namespace
from devservers.savings import RETENTION
from mesh.workdir import DEFAULT_EXCLUDES, DEFAULT_MAX_MB

# The commands about a team's jobs, in the team's namespace (the others: a user's DevServers).
TEAM_COMMANDS = ("status", "logs", "fetch", "submit", "usage")
DURATION = r"^([0-9]+[hm])+$"  # as the CRD's idleTimeout: 2h, 45m, 1h30m


# `devctl run`: which directory is synced by default.
WORKDIR_HELP = (
    "the directory to sync to every pod (~/devctl/<its name> there; the script runs from it); "
    "default: the script's directory, never more (e.g. --workdir . for scripts/train.py)"
)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="devctl", description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-n",
        "--namespace",
        help="your namespace, dev-<you> (default: the kubeconfig context's namespace)",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)

    def command(name: str, **kwargs) -> argparse.ArgumentParser:
        return subparsers.add_parser(name, parents=[common], **kwargs)

    create = command("create", help="create a DevServer")
    create.add_argument("name", help="the server's name, e.g. box")
    create.add_argument("--flavor", required=True, help="a DevServerFlavor (kubectl get dsf)")
    create.add_argument(
        "--image",
        help="container image with a shell and sshd (default: $DEVCTL_IMAGE; with --dry-run, "
        "else the stack's trainer image)",
    )
    create.add_argument(
        "--distributed", action="store_true", help="several pods for torchrun (default: one pod)"
    )
    create.add_argument(
        "--replicas", type=int, default=2, help="pods when distributed (default: %(default)s)"
    )
    create.add_argument(
        "--nproc-per-node", type=int, help="processes per pod (default: the flavor's GPUs)"
    )
    create.add_argument(
        "--backend",
        choices=["nccl", "gloo"],
        default="nccl",
        help="torch.distributed backend of torchrun.sh (default: %(default)s)",
    )
    create.add_argument(
        "--home-size", default="100Gi", help="home volume per pod (default: %(default)s)"
    )
    create.add_argument(
        "--ssh-key",
        action="append",
        type=Path,
        help="public key file to authorize (default: ~/.ssh/id_ed25519.pub or id_rsa.pub)",
    )
    create.add_argument(
        "--load-balancer",
        action="store_true",
        help="SSH through a LoadBalancer (default: through the API server's port-forward)",
    )
    create.add_argument(
        "--idle-timeout",
        default="2h",
        help="stop after this long idle, e.g. 45m, 1h30m (default: %(default)s)",
    )
    create.add_argument(
        "--no-auto-shutdown",
        action="store_true",
        help="never stop when idle (default: stop after --idle-timeout)",
    )
    create.add_argument(
        "--keep-alive-process",
        action="append",
        dest="keep_alive",
        metavar="NAME",
        help="a process (ps -o comm) whose presence keeps the server running, e.g. python; "
        "'*': any (default none: only SSH sessions and GPU or CPU use count)",
    )
    create.add_argument(
        "--user", help="dry run: whose server (default: your kubeconfig's namespace, else $USER)"
    )
    create.add_argument(
        "--stack",
        help="dry run: the stack file to take defaults from (default: the first "
        "Pulumi.<stack>.yaml by name)",
    )
    add_dry_run_options(create, "the DevServer")

    command("list", help="your DevServers").add_argument(
        "--homes",
        action="store_true",
        help="your home volumes instead, kept ones included (default: the servers)",
    )
    keep = command("keep", help="postpone an idle stop: not before DURATION from now")
    keep.add_argument("name", help="the server")
    keep.add_argument("duration", type=duration, help="2h, 90m, 1h30m")
    ssh = command(
        "ssh", help="SSH into a server (through the API server); ssh's own arguments after --"
    )
    ssh.add_argument("name", help="the server")
    ssh.add_argument(
        "--replica",
        type=int,
        default=0,
        help="which pod of a distributed server (default: %(default)s)",
    )
    command(
        "ssh-config",
        help="write ~/.ssh entries for your servers: `ssh box`, VS Code Remote-SSH",
    )
    proxy = command("proxy", help="ssh's ProxyCommand: stdin/stdout to a pod's sshd")
    proxy.add_argument("name", help="the server")
    proxy.add_argument(
        "--replica",
        type=int,
        default=0,
        help="which pod of a distributed server (default: %(default)s)",
    )
    run = command(
        "run",
        help="sync a working directory to every pod of a server, then torchrun a script on each; "
        "devctl's options come before the server",
    )
    run.add_argument("--workdir", type=Path, help=WORKDIR_HELP)
    run.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="leave out paths matching GLOB (repeatable); left out by default: "
        + " ".join(DEFAULT_EXCLUDES),
    )
    run.add_argument(
        "--max-size",
        type=int,
        default=DEFAULT_MAX_MB,
        metavar="MIB",
        help="refuse a working directory bigger than this (default: %(default)s)",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would be synced and run, do nothing; still asks the cluster for the "
        "server's pods (default: off)",
    )
    run.add_argument("name", help="the server")
    run.add_argument("script", type=Path, help="the script to torchrun, inside the workdir")
    run.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments")
    monitor = command("monitor", help="status, GPU use and idle time")
    monitor.add_argument("name", help="the server")
    monitor.add_argument(
        "--watch", type=float, metavar="SECONDS", help="repeat every SECONDS (default: once)"
    )
    for verb, text in (("stop", "scale to zero, keep the home"), ("start", "bring it back")):
        command(verb, help=text).add_argument("name", help="the server")
    savings = command(
        "savings",
        help="node-hours and cost your servers used, and what idle stops saved, over a period",
    )
    savings.add_argument(
        "--since",
        type=period,
        default="7d",
        help=f"the period up to now (7d, 36h; at most {RETENTION.days}d, how long servers "
        "keep their record); default 7d",
    )
    savings.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="every user's servers (a platform administrator's view; default: your namespace's)",
    )
    delete = command("delete", help="delete a server (its home is kept unless asked)")
    delete.add_argument("name", help="the server")
    delete.add_argument(
        "--delete-home",
        action="store_true",
        help="delete its home volumes too (default: keep them)",
    )
    team = argparse.ArgumentParser(add_help=False)
    team.add_argument(
        "-n",
        "--namespace",
        help="your team's namespace (default: the kubeconfig context's namespace)",
    )

    def team_command(name: str, **kwargs) -> argparse.ArgumentParser:
        return subparsers.add_parser(name, parents=[team], **kwargs)

    status = team_command(
        "status",
        help="your team's training jobs (PyTorchJob, MPIJob, TrainJob): queued and why, "
        "admitted, running, evicted, finished",
    )
    status.add_argument("job", nargs="?", help="only this job (default: all of them)")
    logs = team_command("logs", help="what a job of your team printed, node by node")
    logs.add_argument("job", help="the job")
    logs.add_argument("--node", type=int, default=0, help="which node's pod (default: 0)")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing as it comes (default: off)"
    )
    fetch = team_command(
        "fetch", help="copy a path of a job's folder (CHECKPOINT_DIR) here, e.g. outputs"
    )
    fetch.add_argument("job", help="the job")
    fetch.add_argument(
        "path", nargs="?", default="outputs", help="in the job's folder (default: outputs)"
    )
    fetch.add_argument("--out", type=Path, help="where to (default: a folder named after the job)")
    fetch.add_argument(
        "--queue", default="", help="the LocalQueue of the copy pod (default: the job's)"
    )
    usage = team_command(
        "usage",
        help="GPU-hours, node-hours and dollars per job, DevServer user and team over a period, "
        "from what the cluster admitted (priced with the stack's price file)",
    )
    usage.add_argument(
        "--since",
        type=period,
        default="7d",
        help=f"the period up to now (7d, 36h; at most {RETENTION.days}d); default 7d",
    )
    usage.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="every namespace, and the pools' nodes and idle time (a platform administrator's "
        "view; default: your team's namespace)",
    )
    usage.add_argument(
        "--stack",
        help="the stack file whose pools and price file price it (default: the first "
        "Pulumi.<stack>.yaml by name)",
    )
    usage.add_argument(
        "--format",
        choices=("table", "csv", "json"),
        default="table",
        help="a table, or CSV or JSON for a spreadsheet or a script (default: table)",
    )
    from devservers.submit import add_parser

    add_parser(team_command)
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # Everything after `--` goes to ssh (or the script) untouched; argparse's subcommands would
    # refuse it.
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser().parse_args(argv[:cut])
    args.passthrough = argv[cut + 1 :]
    if args.command == "create" and not args.image:
        args.image = os.environ.get("DEVCTL_IMAGE")
    return args


def period(text: str) -> timedelta:
    if not re.fullmatch(r"^([0-9]+[dhm])+$", text):
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: days, hours, minutes, e.g. 7d, 36h")
    found = timedelta(seconds=parse_duration(text))
    if not timedelta(0) < found <= RETENTION:
        raise argparse.ArgumentTypeError(
            f"{text!r}: allowed: up to {RETENTION.days}d (servers keep their record that long)"
        )
    return found


def duration(text: str) -> str:
    if not re.fullmatch(DURATION, text):
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: hours and minutes, e.g. 2h, 1h30m")
    return text


def public_keys(files: list[Path] | None) -> list[str]:
    """The keys in `files`, else in the first of ~/.ssh/id_{ed25519,ecdsa,rsa}.pub found."""
    if not files:
        found = [Path.home() / ".ssh" / f"id_{kind}.pub" for kind in ("ed25519", "ecdsa", "rsa")]
        files = [p for p in found if p.is_file()][:1]
    keys = [k for k in (p.expanduser().read_text().strip() for p in files) if k]
    if not keys:
        print(
            "devctl: warning: no SSH public key (--ssh-key); SSH logins will fail", file=sys.stderr
        )
    return keys


def server_manifest(args: argparse.Namespace, namespace: str, keys: list[str]) -> dict:
    """The DevServer `devctl create` submits: the same object with or without --dry-run."""
    owner = owner_of_namespace(namespace)
    if owner is None:
        raise CliError(f"namespace {namespace!r} is not a user namespace; allowed: dev-<user>")
    if not args.image:
        raise CliError("--image is required (or set DEVCTL_IMAGE), e.g. the trainer image")
    spec: dict = {
        "owner": owner,
        "flavor": args.flavor,
        "image": args.image,
        "mode": "distributed" if args.distributed else "standalone",
        "persistentHomeSize": args.home_size,
        "ssh": {
            "enabled": True,
            "authorizedKeys": keys,
            "serviceType": "LoadBalancer" if args.load_balancer else "ClusterIP",
        },
        "lifecycle": {"idleTimeout": args.idle_timeout, "autoShutdown": not args.no_auto_shutdown},
    }
    if args.keep_alive:
        spec["lifecycle"]["keepAliveProcesses"] = args.keep_alive
    if args.distributed:
        spec["distributed"] = {"worldSize": args.replicas, "backend": args.backend}
        if args.nproc_per_node:
            spec["distributed"]["nprocPerNode"] = args.nproc_per_node
    return {
        "apiVersion": API_VERSION,
        "kind": "DevServer",
        "metadata": {"name": args.name, "namespace": namespace},
        "spec": spec,
    }


def resolve_namespace(args: argparse.Namespace) -> str:
    namespace = args.namespace or kube_namespace()
    if not namespace:
        yours = "<your team>" if args.command in TEAM_COMMANDS else "dev-<you>"
        raise CliError(f"which namespace? pass --namespace {yours} or set it in your kubeconfig")
    return namespace


def dry_run_manifest(args: argparse.Namespace) -> dict:
    """The DevServer `create` would submit, with no cluster: the namespace from --namespace,
    --user, the kubeconfig or $USER (a user of the stack file), the image from --image,
    $DEVCTL_IMAGE or the stack's trainer image, the flavor checked against the stack's."""
    try:
        from devservers.stack_defaults import StackDefaults, StackDefaultsError
    except ImportError:  # devctl installed alone (devservers/pyproject.toml)
        raise CliError(
            "create --dry-run reads the stack files of the project's checkout with its config "
            "code: run the checkout's .venv/bin/devctl (make venv), not devctl installed alone"
        ) from None

    try:
        stack = StackDefaults.load(args.stack)
        stack.check_flavor(args.flavor)
        if args.namespace:
            namespace = args.namespace
        elif args.user:
            namespace = stack.namespace(args.user, "--user")
        else:
            namespace = kube_namespace() or stack.namespace(os.environ.get("USER"), "$USER")
        notes = [f"namespace {namespace}"]
        if not args.image:
            args.image, source = stack.image()
            notes.append(f"image from {source}")
    except StackDefaultsError as e:
        raise CliError(str(e)) from None
    manifest = server_manifest(args, namespace, public_keys(args.ssh_key))
    print(f"devctl: dry run with {stack.file}: {'; '.join(notes)}", file=sys.stderr)
    return manifest


def _run(args: argparse.Namespace, devctl: Devctl) -> int:
    if args.command == "status":
        devctl.status(args.job)
    elif args.command in ("logs", "fetch"):
        from devservers import job_output

        if args.command == "logs":
            return job_output.logs(devctl, args.job, args.node, args.follow)
        return job_output.fetch(devctl, args.job, args.path, args.out, args.queue)
    elif args.command == "list":
        devctl.list_homes() if args.homes else devctl.list_servers()
    elif args.command == "keep":
        devctl.keep(args.name, args.duration)
    elif args.command in ("stop", "start"):
        devctl.set_stopped(args.name, args.command == "stop")
    elif args.command == "delete":
        devctl.delete(args.name, args.delete_home)
    elif args.command == "savings":
        devctl.savings(args.since, args.all_namespaces)
    elif args.command == "usage":
        devctl.usage(args.since, args.all_namespaces, args.stack, args.format)
    elif args.command == "monitor":
        while True:
            devctl.monitor(args.name)
            if not args.watch:
                break
            time.sleep(args.watch)
            print(file=devctl.out)
    elif args.command == "run":
        from devservers.run import run

        return run(devctl, args)
    elif args.command in ("ssh", "ssh-config", "proxy"):
        from devservers import ssh

        if args.command == "ssh":
            return ssh.ssh(devctl, args.name, args.replica, args.passthrough)
        if args.command == "proxy":
            return ssh.proxy(devctl, args.name, args.replica)
        ssh.write_ssh_config(devctl)
    return 0


def main(argv: list[str] | None = None, out=sys.stdout) -> int:
    args = parse_args(argv)
    try:
        if args.command == "submit":
            from devservers.submit import BAD_INPUT, submit

            try:
                return submit(args, out)
            except (CliError, OSError) as e:
                print(f"devctl: {e}", file=sys.stderr)
                return BAD_INPUT
        if args.command == "create" and args.dry_run:
            print_manifest(dry_run_manifest(args), args.output, out)
            return 0
        namespace = None if getattr(args, "all_namespaces", False) else resolve_namespace(args)
        from devservers.kube import KubeCluster

        devctl = Devctl(KubeCluster(), namespace, out)
        if args.command == "create":
            devctl.create(server_manifest(args, namespace, public_keys(args.ssh_key)))
            return 0
        return _run(args, devctl)
    except (CliError, OSError) as e:
        print(f"devctl: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C outside `devctl run`'s own handling: no traceback
        print("devctl: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    # As the package's module, not as __main__: devservers.ssh and devservers.run import that
    # one, and its CliError must be the one main catches.
    from devservers import cli

    sys.exit(cli.main())
