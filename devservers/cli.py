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

It talks to the cluster with the kubernetes Python client and your kubeconfig (the namespace is
dev-<you>, for `status` your team's: --namespace, else the kubeconfig context's), never
kubectl: `ssh` and the entries `ssh-config` writes run your ssh through `devctl proxy`, a tunnel
through the API server's port-forward (devservers.ssh); `run` execs through the API server
(devservers.run).
`create --dry-run` needs no cluster: what the cluster would tell it comes from the stack file
(devservers.stack_defaults).
"""

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from devservers.activity import parse_duration
from devservers.api import (
    API_VERSION,
    GPU,
    GPU_REQUESTS,
    NAMESPACE_PREFIX,
    QUOTA,
    SERVER_COUNT,
    SERVER_LABEL,
    STOP_WARNING,
    STORAGE_QUOTA_SUFFIX,
    parse_timestamp,
    timestamp,
)
from devservers.controller import pod_ready
from devservers.render import home_claims, owner_of_namespace, world_size
from devservers.savings import RETENTION, Totals, report
from mesh.workdir import DEFAULT_EXCLUDES, DEFAULT_MAX_MB

# The commands about a team's jobs, in the team's namespace (the others: a user's DevServers).
TEAM_COMMANDS = ("status", "logs", "fetch", "submit")
DURATION = r"^([0-9]+[hm])+$"  # as the CRD's idleTimeout: 2h, 45m, 1h30m


class CliError(Exception):
    """A message for the user; devctl exits 1 with it, never with a traceback."""


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
    from devservers.submit import add_parser

    add_parser(team_command)
    return parser


def add_dry_run_options(command: argparse.ArgumentParser, what: str) -> None:
    command.add_argument(
        "--dry-run",
        action="store_true",
        help=f"print {what}, create nothing; needs no cluster (default: off)",
    )
    command.add_argument(
        "-o",
        "--output",
        choices=["yaml", "json"],
        default="yaml",
        help="format of --dry-run (default: %(default)s)",
    )


def print_manifest(manifest: dict, output: str, out) -> None:
    """What --dry-run prints: the object as YAML or JSON."""
    if output == "yaml":
        text = yaml.safe_dump(manifest, sort_keys=False)
    else:
        text = json.dumps(manifest, indent=2)
    print(text, end="" if text.endswith("\n") else "\n", file=out)


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


def now() -> datetime:
    return datetime.now(UTC)


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


def _span(delta: timedelta) -> str:
    """A duration as `3d4h`, `1h52m` or `8m` (none below zero)."""
    minutes = max(int(delta.total_seconds() // 60), 0)
    days, hours, minutes = minutes // 1440, minutes // 60 % 24, minutes % 60
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    return f"{minutes}m"


def idle_stop(server: dict, moment: datetime) -> str:
    """When an idle server stops: `in 1h52m`, `in 8m (warned)`, `never` (autoShutdown off) or
    `-` (not running)."""
    status = server.get("status") or {}
    if not server["spec"].get("lifecycle", {}).get("autoShutdown", True):
        return "never"
    if not status.get("idleStopAt"):
        return "-"
    warned = any(c["type"] == STOP_WARNING for c in status.get("conditions") or [])
    left = _span(parse_timestamp(status["idleStopAt"]) - moment)
    return f"in {left}" + (" (warned)" if warned else "")


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


def _kube_namespace() -> str | None:
    try:
        from kubernetes import config

        from devservers.kube import kubeconfig_paths

        _, context = config.list_kube_config_contexts(config_file=kubeconfig_paths())
    except Exception:  # noqa: BLE001 (no kubeconfig: the caller says what to pass instead)
        return None
    return (context or {}).get("context", {}).get("namespace")


def resolve_namespace(args: argparse.Namespace) -> str:
    namespace = args.namespace or _kube_namespace()
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
            namespace = _kube_namespace() or stack.namespace(os.environ.get("USER"), "$USER")
        notes = [f"namespace {namespace}"]
        if not args.image:
            args.image, source = stack.image()
            notes.append(f"image from {source}")
    except StackDefaultsError as e:
        raise CliError(str(e)) from None
    manifest = server_manifest(args, namespace, public_keys(args.ssh_key))
    print(f"devctl: dry run with {stack.file}: {'; '.join(notes)}", file=sys.stderr)
    return manifest


class Devctl:
    """The commands, over the cluster boundary (devservers.kube.KubeCluster)."""

    def __init__(self, cluster, namespace: str, out=sys.stdout):
        self.cluster, self.namespace, self.out = cluster, namespace, out

    @contextlib.contextmanager
    def allowed(self, what: str, team: bool = False):
        """`team`: about a team's jobs, which its members reach in the team's namespace alone."""
        try:
            yield
        except PermissionError as e:
            # The API server's reason (RBAC, or a quota it enforces) follows the usual cause.
            where = f"namespace {self.namespace}" if self.namespace else "all namespaces"
            usual = (
                "your role must be among the team's members (queues.teams[].members)"
                if team
                else f"you may manage DevServers only in your own namespace "
                f"({NAMESPACE_PREFIX}<you>)"
            )
            raise CliError(f"not allowed to {what} in {where} ({e}); {usual}") from None

    def _call(self, what: str, fn, *args):
        with self.allowed(what):
            return fn(*args)

    def server(self, name: str) -> dict:
        found = self._call(
            "read DevServers", self.cluster.get, API_VERSION, "DevServer", name, self.namespace
        )
        if found is None:
            raise CliError(f"no DevServer {name!r} in {self.namespace}; `devctl list` shows yours")
        return found

    def create(self, manifest: dict) -> None:
        spec = manifest["spec"]
        flavor = self.cluster.get(API_VERSION, "DevServerFlavor", spec["flavor"], None)
        if flavor is None:
            names = sorted(
                f["metadata"]["name"]
                for f in self.cluster.list(API_VERSION, "DevServerFlavor", None, {})
            )
            raise CliError(f"unknown flavor {spec['flavor']!r}; available: {', '.join(names)}")
        pods = spec.get("distributed", {}).get("worldSize", 1)
        gpus = int(flavor["spec"]["resources"]["limits"].get(GPU, "0")) * pods
        self._check_quota(gpus)
        self._call("create DevServers", self.cluster.create, manifest)
        print(
            f"devserver/{manifest['metadata']['name']} created; `devctl monitor "
            f"{manifest['metadata']['name']}` follows it",
            file=self.out,
        )

    def _check_quota(self, gpus: int) -> None:
        quota = self._call(
            "read quotas", self.cluster.get, "v1", "ResourceQuota", QUOTA, self.namespace
        )
        if quota is None:
            return
        hard, used = quota["spec"]["hard"], (quota.get("status") or {}).get("used", {})
        for resource, adding, what in ((SERVER_COUNT, 1, "servers"), (GPU_REQUESTS, gpus, "GPUs")):
            if resource in hard and int(used.get(resource, "0")) + adding > int(hard[resource]):
                raise CliError(
                    f"over quota: {used.get(resource, '0')} of {hard[resource]} {what} in use, "
                    f"this server needs {adding} more; stop or delete one (`devctl list`)"
                )

    def _table(self, rows: list[list[str]]) -> None:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            print(
                "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(),
                file=self.out,
            )

    def list_servers(self) -> None:
        rows = [
            ["NAME", "FLAVOR", "MODE", "READY", "PHASE", "KUEUE", "SSH", "LAST ACTIVITY", "STOPS"]
        ]
        moment = now()
        for s in self.servers():
            status = s.get("status") or {}
            rows.append(
                [
                    s["metadata"]["name"],
                    s["spec"]["flavor"],
                    s["spec"].get("mode", "standalone"),
                    f"{status.get('replicasReady', 0)}/{status.get('replicas', 0)}",
                    status.get("phase", "-"),
                    status.get("kueue", "-"),
                    status.get("sshEndpoint", "-"),
                    status.get("lastActivity", "-"),
                    idle_stop(s, moment),
                ]
            )
        self._table(rows)

    def list_homes(self) -> None:
        """Every home volume, and whether a server still uses it: a home kept after its server
        was deleted, or beyond a distributed server's pods after a shrink, is used by none and
        costs its size until deleted."""
        servers = {s["metadata"]["name"]: s for s in self.servers()}
        claims = self._call(
            "list volumes", self.cluster.list, "v1", "PersistentVolumeClaim", self.namespace, {}
        )
        rows = [["NAME", "SERVER", "STATE", "SIZE", "STORAGECLASS", "AGE"]]
        moment, kept = now(), []
        for claim in sorted(claims, key=lambda c: c["metadata"]["name"]):
            meta, spec = claim["metadata"], claim["spec"]
            owner = (meta.get("labels") or {}).get(SERVER_LABEL)
            if owner is None:
                continue  # not a home (the shared EFS claim)
            server = servers.get(owner)
            if server is None:
                state = "kept: server deleted"
            elif meta["name"] not in home_claims(server):
                state = f"kept: beyond its {world_size(server)} pods"
            else:
                state = "stopped" if server["spec"].get("stopped") else "in use"
            if state.startswith("kept"):
                kept.append(meta["name"])
            size = ((claim.get("status") or {}).get("capacity") or {}).get(
                "storage", spec["resources"]["requests"]["storage"]
            )
            age = _span(moment - parse_timestamp(meta["creationTimestamp"]))
            rows.append([meta["name"], owner, state, size, spec.get("storageClassName", "-"), age])
        self._table(rows)
        quota = self._call(
            "read quotas", self.cluster.get, "v1", "ResourceQuota", QUOTA, self.namespace
        )
        hard = (quota or {}).get("spec", {}).get("hard", {})
        used = ((quota or {}).get("status") or {}).get("used") or {}
        for key in (k for k in hard if k.endswith(STORAGE_QUOTA_SUFFIX)):
            # status.used is the quota controller's count, absent until it has counted.
            counted = f"{used[key]} in use of " if key in used else ""
            print(f"home storage quota: {counted}{hard[key]}", file=self.out)
        if kept:
            print(
                f"kept homes cost their size until deleted: kubectl -n {self.namespace} delete "
                f"pvc {' '.join(kept)}",
                file=self.out,
            )

    def _change(self, name: str, spec: dict) -> dict:
        """Merge `spec` into server `name`'s spec; returns the server as it was."""
        server = self.server(name)
        self._call(
            "change DevServers",
            self.cluster.patch,
            API_VERSION,
            "DevServer",
            name,
            self.namespace,
            {"spec": spec},
        )
        return server

    def keep(self, name: str, span: str) -> None:
        """Postpone an idle stop: lifecycle.keepUntil, which the operator honours."""
        until = timestamp(now() + timedelta(seconds=parse_duration(span)))
        server = self._change(name, {"lifecycle": {"keepUntil": until}})
        never = not server["spec"].get("lifecycle", {}).get("autoShutdown", True)
        print(
            f"devserver/{name} kept: not stopped for idleness before {until}"
            + (" (autoShutdown is off: it never is)" if never else ""),
            file=self.out,
        )

    def set_stopped(self, name: str, stopped: bool) -> None:
        self._change(name, {"stopped": stopped})
        print(
            f"devserver/{name} {'stopping (home kept)' if stopped else 'starting'}", file=self.out
        )

    def delete(self, name: str, delete_home: bool) -> None:
        self.server(name)
        self._call(
            "delete DevServers", self.cluster.delete, API_VERSION, "DevServer", name, self.namespace
        )
        claims = self.cluster.list(
            "v1", "PersistentVolumeClaim", self.namespace, {SERVER_LABEL: name}
        )
        if delete_home:
            for claim in claims:
                self._call(
                    "delete volumes",
                    self.cluster.delete,
                    "v1",
                    "PersistentVolumeClaim",
                    claim["metadata"]["name"],
                    self.namespace,
                )
        kept = (
            ""
            if delete_home or not claims
            else f"; home kept: {', '.join(c['metadata']['name'] for c in claims)}"
        )
        print(f"devserver/{name} deleted{kept}", file=self.out)

    def monitor(self, name: str) -> None:
        server = self.server(name)
        status, lifecycle = server.get("status") or {}, server["spec"].get("lifecycle", {})
        last = status.get("lastActivity")
        idle = "-"
        if last and status.get("phase") == "Running":
            since = now() - parse_timestamp(last)
            idle = f"{int(since.total_seconds() // 60)}m of {lifecycle.get('idleTimeout', '2h')}"
        gpu = status.get("gpuUtilization")
        lines = {
            "phase": status.get("phase", "-")
            + (f" ({status['reason']})" if status.get("reason") else ""),
            "pods ready": f"{status.get('replicasReady', 0)}/{status.get('replicas', 0)}",
            "kueue": status.get("kueue", "-"),
            "GPU utilization": "-" if gpu is None else f"{gpu:.0f}%",
            "SSH sessions": str(status.get("activeSessions", "-")),
            "last activity": (last or "-")
            + (f" ({status['lastActivityReason']})" if status.get("lastActivityReason") else ""),
            "idle": idle
            if lifecycle.get("autoShutdown", True)
            else "never stops (autoShutdown off)",
            "ssh": status.get("sshEndpoint", "-"),
        }
        lines["idle stop"] = idle_stop(server, now())
        if lifecycle.get("keepUntil"):
            lines["kept until"] = lifecycle["keepUntil"]
        warning = next(
            (c for c in status.get("conditions") or [] if c["type"] == STOP_WARNING), None
        )
        if warning:
            lines["warning"] = warning["message"]
        if status.get("message"):
            lines["message"] = status["message"]
        for key, value in lines.items():
            print(f"{key + ':':17}{value}", file=self.out)

    def savings(self, since: timedelta, everyone: bool) -> None:
        """Per user and in total: node-hours the servers ran and their list price, against the
        node-hours idle stops left unused (from each stop until the server was asked to run
        again, or now) and what they would have cost (devservers.savings)."""
        until = now()
        namespace = None if everyone else self.namespace
        servers = self._call(
            "list DevServers", self.cluster.list, API_VERSION, "DevServer", namespace, {}
        )
        found = report(servers, until - since, until)
        rows = [["USER", "USED NODE-H", "USED $", "IDLE-STOPPED NODE-H", "SAVED $", "SAVED"]]
        total = Totals()
        for user in sorted(found):
            totals = found[user]
            rows.append([user, *totals.row()])
            total.merge(totals)
        if len(found) != 1:
            rows.append(["total", *total.row()])
        print(
            f"{timestamp(until - since)} to {timestamp(until)}, {len(servers)} servers "
            f"({'all namespaces' if everyone else self.namespace})",
            file=self.out,
        )
        self._table(rows)
        print(
            "SAVED: what the idle-stopped servers would have cost running, as a share of that "
            "plus what the servers cost (list prices)",
            file=self.out,
        )
        if total.unpriced_node_hours:
            print(
                f"unpriced: {total.unpriced_node_hours:.2f} node-hours on nodes without a price "
                "(hybrid machines), counted in node-hours only",
                file=self.out,
            )

    def pods(self, server: dict) -> list[str]:
        """Every pod of the server, all ready (what `devctl run` needs)."""
        name = server["metadata"]["name"]
        ready = (server.get("status") or {}).get("replicasReady", 0)
        count = world_size(server)
        if server["spec"].get("stopped") or ready < count:
            raise CliError(
                f"devserver/{name} is not running ({ready}/{count} pods ready); "
                f"`devctl start {name}`"
            )
        return [f"{name}-{i}" for i in range(count)]

    def pod(self, server: dict, replica: int) -> str:
        """Pod `replica` of the server, ready (its siblings need not be: one SSH session needs
        one pod)."""
        name, count = server["metadata"]["name"], world_size(server)
        if not 0 <= replica < count:
            raise CliError(f"--replica {replica}; allowed: 0 to {count - 1}")
        if server["spec"].get("stopped"):
            raise CliError(f"devserver/{name} is stopped; `devctl start {name}`")
        pod = f"{name}-{replica}"
        found = self._call("read pods", self.cluster.get, "v1", "Pod", pod, self.namespace)
        if found is None or not pod_ready(found):
            phase = ((found or {}).get("status") or {}).get("phase", "not created yet")
            raise CliError(
                f"pod {pod} of devserver/{name} is not ready ({phase}); `devctl monitor {name}` "
                "follows the server"
            )
        return pod

    def status(self, job: str | None) -> None:
        from devservers.job_status import collect, table

        try:
            found = collect(self.cluster, self.namespace, job)
        except PermissionError as e:
            raise CliError(
                f"not allowed to read jobs in namespace {self.namespace} ({e}); your role must "
                "be among your team's members (queues.teams[].members of the stack)"
            ) from None
        if not found:
            what = f"no job {job!r}" if job else "no PyTorchJob, MPIJob or TrainJob"
            print(f"{what} in {self.namespace}", file=self.out)
            return
        print("\n".join(table(found)), file=self.out)

    def servers(self) -> list[dict]:
        return self._call(
            "list DevServers", self.cluster.list, API_VERSION, "DevServer", self.namespace, {}
        )


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
