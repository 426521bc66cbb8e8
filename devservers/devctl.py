"""devctl's commands over the cluster boundary (devservers.kube.KubeCluster), the errors it shows
users, and the --dry-run output: what the command line (devservers.cli) and the commands in their
own modules (run, ssh, submit, job_output) share."""

import argparse
import contextlib
import json
import sys
from datetime import UTC, datetime, timedelta

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
from devservers.render import home_claims, world_size
from devservers.savings import LEDGER_LABELS, LEDGER_PREFIX, Totals, report, with_deleted


class CliError(Exception):
    """A message for the user; devctl exits 1 with it, never with a traceback."""


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


def now() -> datetime:
    return datetime.now(UTC)


def span(delta: timedelta) -> str:
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
    left = span(parse_timestamp(status["idleStopAt"]) - moment)
    return f"in {left}" + (" (warned)" if warned else "")


def kube_namespace() -> str | None:
    try:
        from kubernetes import config

        from devservers.kube import kubeconfig_paths

        _, context = config.list_kube_config_contexts(config_file=kubeconfig_paths())
    except Exception:  # noqa: BLE001 (no kubeconfig: the caller says what to pass instead)
        return None
    return (context or {}).get("context", {}).get("namespace")


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
            age = span(moment - parse_timestamp(meta["creationTimestamp"]))
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
        servers = with_deleted(servers, self._ledgers(namespace), until - since)
        deleted = sum(1 for s in servers if "deletedAt" in s["metadata"])
        found = report(servers, until - since, until)
        rows = [
            [
                "USER",
                "USED NODE-H",
                "USED $",
                "KEPT $",
                "IDLE-STOPPED NODE-H",
                "SAVED $",
                "SAVED",
                "NODE VIEW $",
                "NODE VIEW",
                "FORGOTTEN NODE-H",
                "BY HAND NODE-H",
            ]
        ]
        total = Totals()
        for user in sorted(found):
            totals = found[user]
            rows.append([user, *totals.row()])
            total.merge(totals)
        if len(found) != 1:
            rows.append(["total", *total.row()])
        print(
            f"{timestamp(until - since)} to {timestamp(until)}, {len(servers)} servers"
            f"{f' ({deleted} deleted)' if deleted else ''} "
            f"({'all namespaces' if everyone else self.namespace})",
            file=self.out,
        )
        self._table(rows)
        print(
            "SAVED: what the idle-stopped servers would have cost running, as a share of that "
            "plus what the servers cost, KEPT (homes, load balancers, running or not) "
            "included (list prices); only each idle stop's first hours count "
            "(devServers.idle.countedStopHours), the rest is FORGOTTEN; stops by hand are BY "
            "HAND, never savings. NODE VIEW: only what fell after the stopped server's nodes "
            "went (SAVED also counts shares of nodes kept up for others; neither counts a freed "
            "node's unheld part)",
            file=self.out,
        )
        if total.unpriced_node_hours:
            print(
                f"unpriced: {total.unpriced_node_hours:.2f} node-hours on nodes without a price "
                "(hybrid machines), counted in node-hours only",
                file=self.out,
            )

    def usage(self, since: timedelta, everyone: bool, stack: str | None, form: str) -> None:
        """GPU-hours, node-hours and dollars per job, DevServer user and (with the nodes'
        rights) idle pool over the period, from what the cluster holds (devservers/usage_report.py
        says what it reads and how it prices)."""
        from devservers import usage_report
        from devservers.job_status import WORKLOAD_API
        from devservers.stack_defaults import StackDefaults, StackDefaultsError
        from usagerecorder.records import JOB_MAP, NODE_MAP, RECORD_LABEL, RECORD_NAMESPACE

        try:
            config = StackDefaults.load(stack).config
        except StackDefaultsError as e:
            raise CliError(str(e)) from None
        until = now()
        start = until - since
        namespace = None if everyone else self.namespace
        where = "all namespaces" if everyone else f"namespace {self.namespace}"
        try:
            workloads = self.cluster.list(WORKLOAD_API, "Workload", namespace, {})
            pods = self.cluster.list("v1", "Pod", namespace, {})
        except PermissionError as e:
            raise CliError(
                f"not allowed to read the jobs of {where} ({e}); a team's members read their "
                "own namespace, `-A` needs a platform administrator"
            ) from None
        # DevServers live in their users' namespaces and nodes are the cluster's: read what
        # these rights allow, and deleted servers' copies only where the live servers could be
        # read (else every copy would look like a deleted server's).
        servers = self._readable(API_VERSION, "DevServer", namespace)
        servers = [] if servers is None else with_deleted(servers, self._ledgers(namespace), start)
        found = self._readable("v1", "Node", None)
        nodes = None if found is None else {n["metadata"]["name"]: n for n in found}
        pricing = usage_report.pricing_of(config)
        flavors = {f.name: f.node_pool for f in config.dev_servers.flavors}
        # What the usage recorder kept of admissions and nodes that are gone (usagerecorder/).
        # Only the recorder's maps, where it writes them: the team namespaces of the stack.
        teams = {team.namespace_name for team in config.queues.teams}
        recorded = [
            m
            for m in self._readable("v1", "ConfigMap", namespace, {RECORD_LABEL: "jobs"}) or []
            if m["metadata"]["namespace"] in teams and m["metadata"]["name"].startswith(JOB_MAP)
        ]
        lines = usage_report.jobs(workloads, pods, nodes or {}, recorded, pricing, start, until)
        lines += usage_report.devserver_lines(servers, flavors, pricing, start, until)
        if everyone and nodes is not None:
            gone = self._readable("v1", "ConfigMap", RECORD_NAMESPACE, {RECORD_LABEL: "nodes"})
            gone = [m for m in gone or [] if m["metadata"]["name"].startswith(NODE_MAP)]
            spans = usage_report.live_nodes(nodes.values(), until)
            spans += usage_report.recorded_nodes(
                gone, {n["metadata"]["uid"] for n in nodes.values()}
            )
            provisioned = usage_report.node_lines(spans, pricing, start, until)
            lines += provisioned + usage_report.idle_lines(provisioned, lines)
        meta = {
            "since": timestamp(start),
            "until": timestamp(until),
            "scope": where,
            "prices": pricing.source(),
            "nodesRead": nodes is not None,
        }
        if form == "csv":
            print(usage_report.as_csv(lines), end="", file=self.out)
        elif form == "json":
            print(usage_report.as_json(lines, meta), file=self.out)
        else:
            self._table(usage_report.as_rows(lines))
            print("\n".join(usage_report.notes(meta)), file=self.out)

    def _readable(
        self, api_version: str, kind: str, namespace: str | None, labels: dict | None = None
    ) -> list[dict] | None:
        """The objects, or None where these rights may not list them."""
        try:
            return self.cluster.list(api_version, kind, namespace, labels or {})
        except PermissionError:
            return None

    def _ledgers(self, namespace: str | None) -> list[dict]:
        """The operator's copies of the DevServer records (devservers.savings.LEDGER_PREFIX) that
        these rights may read: a user's namespace, or every user namespace."""
        found = self._readable("v1", "ConfigMap", namespace, LEDGER_LABELS) or []
        return [
            c
            for c in found
            if c["metadata"]["name"].startswith(LEDGER_PREFIX)
            and c["metadata"]["namespace"].startswith(NAMESPACE_PREFIX)
        ]

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
