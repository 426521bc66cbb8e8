"""What DevServers cost and what idle stops saved: each server's usage record, and the report.

The operator keeps, in each server's status (`status.usage`, which only it may write), the
periods the server ran and the periods it stood stopped: by an idle stop, or by hand (its user
set spec.stopped), each from the stop to when it was asked to run again (or to now). Each period
names the instance type of the nodes its pods ran on, the share of those nodes the pods held
(`nodes`: GPUs, CPUs or memory, whichever share is largest, summed over the pods) and that
share's hourly list price. The report (`devctl savings`) adds them up over a period of time:
node-hours used and their cost, against the node-hours idle stops left unused and the cost they
saved, per user and in total.

What it counts as saved is bounded: only the first `countedHours` of an idle stop (the stack's
devServers.idle.countedStopHours, a working day by default, written into the period when the
stop opens it). A server stopped for idleness and not started again for days was forgotten, not
saved by the stop: the rest of its stop is reported apart. Stops by hand are the user's own
doing and are reported apart too, never as savings.

Saved two ways. The share view counts a stop's share of its nodes as saved for its counted
hours, whether or not the node went: it over-credits stops whose nodes stay up for other
servers' pods. The node view counts it only from when the operator found every node the server
ran on gone (`nodesGoneAt`, seen at its checks of stopped servers). Both under-credit a node
that went: its unheld part is credited to no one (a gpu-1 server alone on a g5.12xlarge frees
the whole node and is credited its quarter). docs/platform/idle-savings.md has a simulated week
of both against the nodes that really ran.

The record lives in the status rather than in Kubernetes Events, which the API server keeps for
an hour (kube-apiserver --event-ttl, 1h by default); the operator also emits an Event and
updates its Prometheus metrics at every idle stop and restart, for those who watch live. It is
copied at every change into a ConfigMap of the server's namespace (LEDGER_PREFIX), which its user
may read and only the operator may write, so that a deleted server stays in the report for as
long as its periods are kept (RETENTION): the operator closes its copy when it sees the deletion
(or, deleted while the operator was down, the copy ends at its last write).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from devservers.api import parse_timestamp, timestamp

RUNNING, IDLE_STOPPED, STOPPED = "Running", "IdleStopped", "Stopped"
# How long a closed period is kept (reports reach back this far), and how many at most.
RETENTION = timedelta(days=35)
MAX_PERIODS = 200
# Each server's record is copied into a ConfigMap of its namespace, LEDGER_PREFIX + its uid
# (one per server: each stays far under the API server's 1 MiB object limit), labelled
# LEDGER_LABELS for devctl to list them. A namespace keeps the copies of at most MAX_DELETED
# deleted servers within RETENTION: beyond it the oldest go, each with a Warning Event.
LEDGER_PREFIX = "devserver-usage-"
LEDGER_LABELS = {"dev.training-platform.io/ledger": "usage"}
RECORD_KEY = "record"
MAX_DELETED = 50


@dataclass(frozen=True)
class Nodes:
    """Where a server's pods run: the instance type (several joined by `+`), the node-equivalents
    they hold, and what those cost per hour (None when a node's type has no price)."""

    instance_type: str
    nodes: float
    usd_per_hour: float | None
    names: tuple[str, ...] = ()  # the nodes' names, for the node view

    def fields(self) -> dict:
        found = {"instanceType": self.instance_type, "nodes": round(self.nodes, 4)}
        if self.names:
            found["nodeNames"] = list(self.names)
        if self.usd_per_hour is not None:
            found["usdPerHour"] = round(self.usd_per_hour, 4)
        return found

    def describe(self) -> str:
        price = f"${self.usd_per_hour:.3f}/h" if self.usd_per_hour is not None else "unpriced"
        return f"{self.nodes:g} node of {self.instance_type}, {price}"


def hours(period: dict, since: datetime, until: datetime) -> float:
    """The hours of `period` between `since` and `until` (an open period runs to `until`)."""
    return hours_between(parse_timestamp(period["start"]), _end(period, until), since, until)


def hours_between(start: datetime, end: datetime, since: datetime, until: datetime) -> float:
    """The hours from `start` to `end` that fall between `since` and `until`."""
    return max((min(end, until) - max(start, since)).total_seconds(), 0) / 3600


def counted_hours(period: dict, since: datetime, until: datetime) -> float:
    """The hours of an idle stop between `since` and `until` within its first countedHours
    (periods recorded before the cap existed carry none and count whole)."""
    return hours_between(
        parse_timestamp(period["start"]), _counted_end(period, until), since, until
    )


def node_hours_gone(period: dict, since: datetime, until: datetime) -> float:
    """The counted hours of an idle stop, between `since` and `until`, after its nodes went."""
    if not period.get("nodesGoneAt"):
        return 0.0
    gone = parse_timestamp(period["nodesGoneAt"])
    return hours_between(gone, _counted_end(period, until), since, until)


def _end(period: dict, until: datetime) -> datetime:
    return parse_timestamp(period["end"]) if period.get("end") else until


def _counted_end(period: dict, until: datetime) -> datetime:
    cap = _count_ends(period)
    return _end(period, until) if cap is None else min(_end(period, until), cap)


def _count_ends(period: dict) -> datetime | None:
    """When an idle stop's counted hours end; None for a period recorded before the cap, which
    counts whole."""
    if "countedHours" not in period:
        return None
    return parse_timestamp(period["start"]) + timedelta(hours=period["countedHours"])


def _counting(period: dict, now: datetime) -> bool:
    cap = _count_ends(period)
    return cap is None or now < cap


@dataclass
class Change:
    """A server's usage record after a reconcile, and the Events to emit for it."""

    usage: list[dict]
    events: list[tuple[str, str]]  # (reason, message)


def record(
    usage: list[dict],
    running: bool,
    wanted: bool,
    idle_stop: bool,
    nodes,
    now: datetime,
    counted_stop_hours: float = 8.0,
    kept_usd_per_hour: float | None = None,
    gone: Callable[[list[str]], bool] = lambda names: False,
) -> Change:
    """The record after a reconcile that found the server `running` (all pods ready) or not,
    `wanted` to run (spec.stopped false) or not, and stopping it now for idleness (`idle_stop`);
    `nodes()` says where its pods run (read only when a running period opens). An idle stop's
    period carries `counted_stop_hours`, the part of it the report counts as saved, and the time
    `gone(names)` first says none of its nodes is left; every period `kept_usd_per_hour`, what
    the server bills running or not (its homes, a load balancer)."""
    kept = {} if kept_usd_per_hour is None else {"keptUsdPerHour": round(kept_usd_per_hour, 6)}
    usage = [dict(p) for p in usage]
    events = []
    last = usage[-1] if usage and not usage[-1].get("end") else None
    stamp = timestamp(now)
    if (
        last
        and last["state"] == IDLE_STOPPED
        and last.get("nodeNames")
        and not last.get("nodesGoneAt")
        and _counting(last, now)  # past its counted hours, nothing more would count
        and gone(last["nodeNames"])
    ):
        last["nodesGoneAt"] = stamp
    if last and last["state"] == RUNNING and (idle_stop or not running):
        last["end"] = stamp
        carried = ("instanceType", "nodes", "usdPerHour", "nodeNames")
        stopped = {k: last[k] for k in carried if k in last}
        stopped.update(kept)
        if idle_stop:
            usage.append(
                {"state": IDLE_STOPPED, "start": stamp, "countedHours": counted_stop_hours,
                 **stopped}
            )  # fmt: skip
            events.append(("IdleStop", f"stopped for idleness: {_describe(last)} not spent"))
        elif not wanted:  # its user stopped it
            usage.append({"state": STOPPED, "start": stamp, **stopped})
        last = None
    elif last and last["state"] == STOPPED and wanted:
        last["end"] = stamp
        last = None
    elif last and last["state"] == IDLE_STOPPED and wanted:
        last["end"] = stamp
        stopped = hours(last, parse_timestamp(last["start"]), now)
        saved = (
            f", ${stopped * last['usdPerHour']:.2f} saved"
            if last.get("usdPerHour") is not None
            else ""
        )
        events.append(
            (
                "IdleRestart",
                f"started again after an idle stop of {stopped:.2f} h: "
                f"{stopped * last['nodes']:.2f} node-hours of {last['instanceType']} not used"
                f"{saved}",
            )
        )
        last = None
    if running and not idle_stop and last is None:
        usage.append({"state": RUNNING, "start": stamp, **nodes().fields(), **kept})
    oldest = now - RETENTION
    recent = [p for p in usage if not p.get("end") or parse_timestamp(p["end"]) >= oldest]
    return Change(recent[-MAX_PERIODS:], events)


def _describe(period: dict) -> str:
    return Nodes(period["instanceType"], period["nodes"], period.get("usdPerHour")).describe()


@dataclass
class Totals:
    used_node_hours: float = 0.0
    used_usd: float = 0.0
    stopped_node_hours: float = 0.0  # idle-stopped, within each stop's counted hours
    saved_usd: float = 0.0
    node_saved_usd: float = 0.0  # of saved_usd, what fell after the stop's nodes went
    forgotten_node_hours: float = 0.0  # idle-stopped beyond them
    by_hand_node_hours: float = 0.0  # stopped by its user
    kept_usd: float = 0.0  # homes and load balancers, running or not
    unpriced_node_hours: float = 0.0  # on nodes without a price (hybrid machines)

    def add(self, period: dict, since: datetime, until: datetime) -> None:
        spent = hours(period, since, until)
        node_hours = spent * period["nodes"]
        usd = spent * period.get("usdPerHour", 0)
        if "usdPerHour" not in period:
            self.unpriced_node_hours += node_hours
        self.kept_usd += spent * period.get("keptUsdPerHour", 0)
        if period["state"] == RUNNING:
            self.used_node_hours += node_hours
            self.used_usd += usd
        elif period["state"] == STOPPED:
            self.by_hand_node_hours += node_hours
        else:
            counted = counted_hours(period, since, until)
            self.stopped_node_hours += counted * period["nodes"]
            self.saved_usd += counted * period.get("usdPerHour", 0)
            self.node_saved_usd += node_hours_gone(period, since, until) * period.get(
                "usdPerHour", 0
            )
            self.forgotten_node_hours += (spent - counted) * period["nodes"]

    def merge(self, other: Totals) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def row(self) -> list[str]:
        def percent(saved: float | None) -> str:
            return "-" if saved is None else f"{saved:.1%}"

        return [
            f"{self.used_node_hours:.2f}",
            f"{self.used_usd:.2f}",
            f"{self.kept_usd:.2f}",
            f"{self.stopped_node_hours:.2f}",
            f"{self.saved_usd:.2f}",
            percent(self.reduction),
            f"{self.node_saved_usd:.2f}",
            percent(self.node_reduction),
            f"{self.forgotten_node_hours:.2f}",
            f"{self.by_hand_node_hours:.2f}",
        ]

    @property
    def reduction(self) -> float | None:
        """The share of what the servers would have cost without idle stops (what they cost,
        homes and load balancers included, plus what the stops saved) that the stops saved;
        None when nothing was priced."""
        return self._of_total(self.saved_usd)

    @property
    def node_reduction(self) -> float | None:
        """The same with only what the node view counts as saved."""
        return self._of_total(self.node_saved_usd)

    def _of_total(self, saved: float) -> float | None:
        total = self.used_usd + self.kept_usd + saved
        return saved / total if total else None


def report(servers: list[dict], since: datetime, until: datetime) -> dict[str, Totals]:
    """Totals per owner (spec.owner) of `servers` (live ones and deleted ones from the ledgers:
    `with_deleted`) between `since` and `until`."""
    found: dict[str, Totals] = {}
    for server in servers:
        totals = found.setdefault(server["spec"]["owner"], Totals())
        for period in (server.get("status") or {}).get("usage") or []:
            totals.add(period, since, until)
    return found


def ledger_name(server: dict) -> str:
    return f"{LEDGER_PREFIX}{server['metadata']['uid']}"


def ledger_copy(server: dict, usage: list[dict], now: datetime, deleted: bool = False) -> dict:
    """The ConfigMap that keeps a server's record: its periods without the node names (only the
    operator's own check reads them), and a deleted server's open period ended now."""
    usage = [{k: v for k, v in p.items() if k != "nodeNames"} for p in usage]
    if deleted and usage and not usage[-1].get("end"):
        usage[-1]["end"] = timestamp(now)
    meta = server["metadata"]
    record = {
        "name": meta["name"],
        "owner": server["spec"]["owner"],
        "flavor": server["spec"]["flavor"],
        "usage": usage,
        "recordedAt": timestamp(now),
    }
    if deleted:
        record["deletedAt"] = timestamp(now)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": ledger_name(server),
            "namespace": meta["namespace"],
            "labels": LEDGER_LABELS,
        },  # fmt: skip
        "data": {RECORD_KEY: json.dumps(record, sort_keys=True)},
    }


def copied_record(ledger: dict | None) -> dict | None:
    """The record a ledger ConfigMap holds; None if it holds none that reads (an edit by hand)."""
    try:
        record = json.loads(((ledger or {}).get("data") or {})[RECORD_KEY])
        return record if isinstance(record.get("usage"), list) and record.get("owner") else None
    except (KeyError, TypeError, ValueError):
        return None


def expired(ledgers: list[dict], now: datetime) -> list[tuple[str, bool]]:
    """(name, within retention) of the namespace's ledger ConfigMaps to delete: deleted servers'
    whose periods all ended before RETENTION, then the oldest deleted beyond MAX_DELETED."""
    deleted = sorted(
        (record["deletedAt"], ledger["metadata"]["name"])
        for ledger in ledgers
        if (record := copied_record(ledger)) and "deletedAt" in record
    )
    oldest = now - RETENTION
    old = [(name, False) for when, name in deleted if parse_timestamp(when) < oldest]
    recent = [name for when, name in deleted if parse_timestamp(when) >= oldest]
    return old + [(name, True) for name in recent[: max(len(recent) - MAX_DELETED, 0)]]


def with_deleted(servers: list[dict], ledgers: list[dict], since: datetime) -> list[dict]:
    """`servers`, and as servers the ledgers' copies of those that are gone (with
    `metadata.deletedAt`), unless gone before `since`; a copy whose deletion the operator did not
    see ends at its last write; copies that do not read are left out."""
    live = {s["metadata"].get("uid") for s in servers}
    found = list(servers)
    for ledger in sorted(ledgers, key=lambda c: c["metadata"]["name"]):
        record = copied_record(ledger)
        if record is None or ledger["metadata"]["name"].removeprefix(LEDGER_PREFIX) in live:
            continue
        gone = record.get("deletedAt", record["recordedAt"])
        if parse_timestamp(gone) < since:
            continue
        usage = [dict(p) for p in record["usage"]]
        if usage and not usage[-1].get("end"):
            usage[-1]["end"] = record["recordedAt"]
        found.append(
            {
                "metadata": {
                    "name": record["name"],
                    "namespace": ledger["metadata"]["namespace"],
                    "deletedAt": gone,
                },
                "spec": {"owner": record["owner"], "flavor": record["flavor"]},
                "status": {"usage": usage},
            }
        )
    return found
