"""What DevServers cost and what idle stops saved: each server's usage record, and the report.

The operator keeps, in each server's status (`status.usage`, which only it may write), the
periods the server ran and the periods it stood stopped by an idle stop: from the stop to when
it was asked to run again (or to now). Each period names the instance type of the nodes its pods
ran on, the share of those nodes the pods held (`nodes`: GPUs, CPUs or memory, whichever share
is largest, summed over the pods) and that share's hourly list price. The report (`devctl
savings`) adds them up over a period of time: node-hours used and their cost, against the
node-hours idle stops left unused and the cost they saved, per user and in total.

The record lives in the status rather than in Kubernetes Events, which the API server keeps for
an hour (kube-apiserver --event-ttl, 1h by default); the operator also emits an Event and
updates its Prometheus metrics at every idle stop and restart, for those who watch live. A
deleted server's record goes with it, so the report covers the servers that exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from devservers.api import parse_timestamp, timestamp

RUNNING, IDLE_STOPPED = "Running", "IdleStopped"
# How long a closed period is kept (reports reach back this far), and how many at most.
RETENTION = timedelta(days=35)
MAX_PERIODS = 200


@dataclass(frozen=True)
class Nodes:
    """Where a server's pods run: the instance type (several joined by `+`), the node-equivalents
    they hold, and what those cost per hour (None when a node's type has no price)."""

    instance_type: str
    nodes: float
    usd_per_hour: float | None

    def fields(self) -> dict:
        found = {"instanceType": self.instance_type, "nodes": round(self.nodes, 4)}
        if self.usd_per_hour is not None:
            found["usdPerHour"] = round(self.usd_per_hour, 4)
        return found

    def describe(self) -> str:
        price = f"${self.usd_per_hour:.3f}/h" if self.usd_per_hour is not None else "unpriced"
        return f"{self.nodes:g} node of {self.instance_type}, {price}"


def hours(period: dict, since: datetime, until: datetime) -> float:
    """The hours of `period` between `since` and `until` (an open period runs to `until`)."""
    start = max(parse_timestamp(period["start"]), since)
    end = min(parse_timestamp(period["end"]) if period.get("end") else until, until)
    return max((end - start).total_seconds(), 0) / 3600


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
) -> Change:
    """The record after a reconcile that found the server `running` (all pods ready) or not,
    `wanted` to run (spec.stopped false) or not, and stopping it now for idleness (`idle_stop`);
    `nodes()` says where its pods run (read only when a running period opens)."""
    usage = [dict(p) for p in usage]
    events = []
    last = usage[-1] if usage and not usage[-1].get("end") else None
    stamp = timestamp(now)
    if last and last["state"] == RUNNING and (idle_stop or not running):
        last["end"] = stamp
        if idle_stop:
            stopped = {k: last[k] for k in ("instanceType", "nodes", "usdPerHour") if k in last}
            usage.append({"state": IDLE_STOPPED, "start": stamp, **stopped})
            events.append(("IdleStop", f"stopped for idleness: {_describe(last)} not spent"))
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
        usage.append({"state": RUNNING, "start": stamp, **nodes().fields()})
    oldest = now - RETENTION
    kept = [p for p in usage if not p.get("end") or parse_timestamp(p["end"]) >= oldest]
    return Change(kept[-MAX_PERIODS:], events)


def _describe(period: dict) -> str:
    return Nodes(period["instanceType"], period["nodes"], period.get("usdPerHour")).describe()


@dataclass
class Totals:
    used_node_hours: float = 0.0
    used_usd: float = 0.0
    stopped_node_hours: float = 0.0
    saved_usd: float = 0.0
    unpriced_node_hours: float = 0.0  # on nodes without a price (hybrid machines)

    def add(self, period: dict, since: datetime, until: datetime) -> None:
        spent = hours(period, since, until)
        node_hours = spent * period["nodes"]
        usd = spent * period.get("usdPerHour", 0)
        if "usdPerHour" not in period:
            self.unpriced_node_hours += node_hours
        if period["state"] == RUNNING:
            self.used_node_hours += node_hours
            self.used_usd += usd
        else:
            self.stopped_node_hours += node_hours
            self.saved_usd += usd

    def merge(self, other: Totals) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def row(self) -> list[str]:
        reduction = self.reduction
        return [
            f"{self.used_node_hours:.2f}",
            f"{self.used_usd:.2f}",
            f"{self.stopped_node_hours:.2f}",
            f"{self.saved_usd:.2f}",
            "-" if reduction is None else f"{reduction:.1%}",
        ]

    @property
    def reduction(self) -> float | None:
        """The share of what the servers would have cost without idle stops that the stops
        saved; None when nothing was priced."""
        total = self.used_usd + self.saved_usd
        return self.saved_usd / total if total else None


def report(servers: list[dict], since: datetime, until: datetime) -> dict[str, Totals]:
    """Totals per owner (spec.owner) of `servers` between `since` and `until`."""
    found: dict[str, Totals] = {}
    for server in servers:
        totals = found.setdefault(server["spec"]["owner"], Totals())
        for period in (server.get("status") or {}).get("usage") or []:
            totals.add(period, since, until)
    return found
