"""Who used what: GPU-hours, node-hours and dollars per job, DevServer user and idle node over a
period, per team, from what the cluster itself holds (`devctl usage`).

What it reads, with the caller's own rights (a team member sees her namespace; `-A` with a
platform administrator's rights sees every namespace and the nodes):
- each Kueue Workload (kueue.x-k8s.io/v1beta2): per pod set the flavor it was admitted to (a
  pool's flavor is named after the pool: infra/kueue/queues.py) and the resources admitted
  (status.admission.podSetAssignments[].resourceUsage, the pod set's total); when: from the
  Admitted condition's lastTransitionTime to the Finished condition's (or the period's end), and
  status.accumulatedPastExecutionTimeSeconds, the time of earlier admissions that ended in an
  eviction (Kueue pkg/workload/admissionchecks.go, v0.19.2; the same at v0.20), which Kueue keeps
  without dates: it counts when the Workload was created inside the period;
- the job's pods (devservers.job_status: the labels each operator sets) for the nodes they run
  on, and those Nodes' instance type and karpenter.sh/capacity-type;
- each DevServer's status.usage, the operator's record of its running periods, and the
  operator's copies of deleted servers' records (devservers/savings.py, LEDGER_PREFIX);
- the Nodes (with `-A`): each node's hours from its creation, for the idle line;
- the usage recorder's records (usagerecorder/records.py): the admissions of Workloads that are
  gone, in each readable team namespace, and (with `-A`) the nodes that are gone.

How it prices: with the stack's price file (infra/core/catalog/prices/<region>.yaml), the file
the plan uses, named in the report. A pod set holds a share of its pool's nodes: of GPUs, vCPUs
and memory, whichever share of the node's instance type is largest (as DevServers count theirs).
That share is priced at its node's rate: On-Demand list price, or the file's spot estimate on a
node labelled spot; where its nodes cannot be read (a team member may not read nodes, or the pods
are gone), at the pool's cheapest type On-Demand, said as such.

What it cannot see: a Workload goes with its job, and a Node with its instance. The recorder
keeps them (every 5 minutes, for billing.usageRecordDays): a job or node that went between two
of its runs is counted to the run that last saw it, and one that came and went before the
recorder ran, or while it was off, is in neither side. Idle is what the pools' nodes were not
admitted for.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from datetime import datetime

from kubernetes.utils import parse_quantity

from devservers.api import GPU, NAMESPACE_PREFIX, controller_ref, parse_timestamp
from devservers.job_status import KINDS as JOB_KINDS
from devservers.job_status import condition, is_true
from devservers.savings import RUNNING, hours, hours_between
from infra.core.catalog import (
    Catalog,
    InstanceType,
    RegionPrices,
    UnpricedError,
    load_catalog,
    load_prices,
)
from infra.core.nodes import POOL_LABEL
from infra.stack.config import StackConfig
from usagerecorder.records import (
    CAPACITY_TYPE_LABEL,
    INSTANCE_TYPE_LABEL,
    ON_DEMAND,
    current_key,
    entries,
    job_pods,
    labels,
    workload_uid,
)

SPOT = "spot"
# Per job kind, the labels its operator puts on the job's pods, `{name}` for the job's name: what
# the usage recorder is given (--job-pods, deploy/program.py) and what this report matches pods
# by (usagerecorder/records.py job_pods). Here, not in job_status.py, which the operator's image
# holds: it has no use for it.
POD_LABELS = {kind.kind: kind.pod_labels("{name}") for kind in JOB_KINDS}
GIB = 2**30


@dataclass(frozen=True)
class Line:
    """One row of the report."""

    team: str  # the namespace
    what: str  # job, devserver or idle
    name: str  # kind/name of the job, the DevServer user, or the idle pool
    pool: str
    capacity: str  # on-demand, spot, mixed, or "list" where the nodes were not read
    gpu_hours: float
    node_hours: float
    usd: float | None  # None: no price (a hybrid machine)


@dataclass(frozen=True)
class Pricing:
    """The stack's pools and the price file."""

    prices: RegionPrices
    pools: dict[str, tuple[str, ...]]  # pool name -> its instance types
    catalog: Catalog

    def node(self, instance: str, capacity: str) -> float | None:
        try:
            if capacity == SPOT and instance in self.prices.spot_usd_per_hour:
                return self.prices.spot_usd_per_hour[instance]
            return self.prices.instance(instance)
        except UnpricedError:
            return None

    def source(self) -> str:
        return (
            f"{self.prices.file}: On-Demand {self.prices.instance_source} (as of "
            f"{self.prices.instance_as_of}); spot {self.prices.spot_source}"
        )

    def cheapest(self, pool: str) -> str | None:
        types = [t for t in self.pools.get(pool, ()) if self.node(t, ON_DEMAND) is not None]
        return min(types, key=lambda t: self.node(t, ON_DEMAND)) if types else None


def pricing_of(config: StackConfig) -> Pricing:
    pools = {p.name: tuple(p.instance_types) for p in config.node_pools if not p.hybrid}
    return Pricing(load_prices(config.region), pools, load_catalog())


def share(usage: dict, kind: InstanceType) -> float:
    """Nodes of `kind` the resources `usage` take: the largest of the GPU, CPU and memory
    shares."""
    parts = [float(parse_quantity(usage.get("cpu", 0))) / kind.vcpu]
    parts.append(float(parse_quantity(usage.get("memory", 0))) / (kind.memory_gib * GIB))
    if kind.gpus:
        parts.append(float(parse_quantity(usage.get(GPU, 0))) / kind.gpus)
    return max(parts)


def admitted_hours(
    workload: dict, since: datetime, until: datetime, recorded_past_s: float = 0.0
) -> float:
    """Hours the Workload held its quota inside the period (see the module's docstring); of its
    earlier admissions, what the recorder did not keep (`recorded_past_s`: the seconds it kept,
    which recorded_job_lines counts)."""
    total = 0.0
    admitted = condition(workload, "Admitted")
    if is_true(workload, "Admitted"):
        finished = condition(workload, "Finished")
        end = parse_timestamp(finished["lastTransitionTime"]) if finished else until
        total += hours_between(parse_timestamp(admitted["lastTransitionTime"]), end, since, until)
    past = (workload.get("status") or {}).get("accumulatedPastExecutionTimeSeconds") or 0
    past = max(past - recorded_past_s, 0)
    if past and parse_timestamp(workload["metadata"]["creationTimestamp"]) >= since:
        total += past / 3600
    return total


def jobs(
    workloads: list[dict],
    pods: list[dict],
    nodes: dict[str, dict],
    maps: list[dict],
    pricing: Pricing,
    since: datetime,
    until: datetime,
) -> list[Line]:
    """The jobs' lines: each admission that holds quota now from its Workload, every other one
    the usage recorder kept from its record (`maps`), and of Kueue's sum of a Workload's earlier
    admissions what the recorder did not keep."""
    recorded = {key: record for _, key, record in entries(maps)}
    current = {key for w in workloads if (key := current_key(w))}
    kept_s: dict[str, float] = {}
    for key, record in recorded.items():
        if key not in current:
            ran = parse_timestamp(record["to"]) - parse_timestamp(record["from"])
            kept_s[workload_uid(key)] = kept_s.get(workload_uid(key), 0) + ran.total_seconds()
    lines = job_lines(workloads, pods, nodes, pricing, since, until, kept_s, recorded)
    return lines + recorded_job_lines(maps, current, pricing, since, until)


def _job_name(workload: dict) -> str:
    owner = controller_ref(workload)  # the job it was made for
    return f"{owner['kind']}/{owner['name']}" if owner else workload["metadata"]["name"]


def _pod_set_line(
    team: str,
    name: str,
    pool: str,
    usage: dict,
    kinds: set[str],  # the instance types of the nodes its pods ran on, where known
    capacities: set[str],  # and their capacity types (none: its nodes are not known)
    spent: float,
    pricing: Pricing,
) -> Line:
    """A pod set's share of its pool's nodes for `spent` hours, priced at the nodes it ran on, or
    at the pool's cheapest type On-Demand (`list`) where they are not known."""
    instance = next(iter(kinds)) if len(kinds) == 1 else pricing.cheapest(pool)
    capacity = "list" if not capacities else "mixed" if len(capacities) > 1 else min(capacities)
    if instance in pricing.catalog:
        node_hours = share(usage, pricing.catalog[instance]) * spent
        rate = pricing.node(instance, capacity)
    else:  # a pool of no EC2 type (the hybrid machines): its GPU-hours, no price
        node_hours, rate, capacity = 0.0, None, "unpriced"
    gpu_hours = float(parse_quantity(usage.get(GPU, 0))) * spent
    usd = None if rate is None else node_hours * rate
    return Line(team, "job", name, pool, capacity, gpu_hours, node_hours, usd)


def job_lines(
    workloads: Iterable[dict],
    pods: list[dict],
    nodes: dict[str, dict],
    pricing: Pricing,
    since: datetime,
    until: datetime,
    recorded_past_s: dict[str, float] | None = None,
    recorded: dict[str, dict] | None = None,
) -> list[Line]:
    """Per Workload of a team namespace and pod set, what it was admitted for in the period
    (`recorded_past_s`: per uid, the seconds of its earlier admissions the recorder kept). Where
    the nodes cannot be read (a team member's rights) or its pods are gone, a pod set is priced
    at the nodes the recorder saw it on (`recorded`: records by key). DevServer namespaces are
    left out: Kueue admits each server's pods through a Workload of its own, which
    devserver_lines counts from the operator's record."""
    recorded_past_s, recorded = recorded_past_s or {}, recorded or {}
    lines = []
    for workload in workloads:
        if workload["metadata"]["namespace"].startswith(NAMESPACE_PREFIX):
            continue
        admission = (workload.get("status") or {}).get("admission")
        past_s = recorded_past_s.get(workload["metadata"]["uid"], 0.0)
        spent = admitted_hours(workload, since, until, past_s)
        if not admission or not spent:
            continue
        on = [nodes[p["spec"]["nodeName"]] for p in job_pods(workload, pods, POD_LABELS)
              if p.get("spec", {}).get("nodeName") in nodes]  # fmt: skip
        record = recorded.get(current_key(workload) or "", {})
        was = {p["name"]: p for p in record.get("podSets") or []}
        for assignment in admission["podSetAssignments"]:
            pool = next(iter((assignment.get("flavors") or {}).values()), "")
            seen = [labels(n) for n in on if labels(n).get(POOL_LABEL) == pool]
            kinds = {n.get(INSTANCE_TYPE_LABEL) for n in seen} - {None}
            capacities = {n.get(CAPACITY_TYPE_LABEL, ON_DEMAND) for n in seen}
            if not seen and assignment.get("name") in was:
                kinds = set(was[assignment["name"]]["instanceTypes"]) - {""}
                capacities = set(was[assignment["name"]]["capacities"])
            lines.append(
                _pod_set_line(
                    workload["metadata"]["namespace"],
                    _job_name(workload),
                    pool,
                    assignment.get("resourceUsage") or {},
                    kinds,
                    capacities,
                    spent,
                    pricing,
                )  # fmt: skip
            )
    return lines


def recorded_job_lines(
    maps: list[dict], current: set[str], pricing: Pricing, since: datetime, until: datetime
) -> list[Line]:
    """The usage recorder's admissions (usagerecorder/records.py) but those that hold quota now
    (`current`, which job_lines counts), one line per job and pod set's pool and capacity."""
    found: dict[tuple, list[Line]] = {}
    for meta, key, record in entries(maps):
        spent = hours_between(parse_timestamp(record["from"]), parse_timestamp(record["to"]),
                              since, until)  # fmt: skip
        if key in current or not spent:
            continue
        for pod_set in record["podSets"]:
            kinds = set(pod_set["instanceTypes"]) - {""}
            line = _pod_set_line(meta["namespace"], record["job"], pod_set["pool"],
                                 pod_set["usage"], kinds, set(pod_set["capacities"]), spent,
                                 pricing)  # fmt: skip
            found.setdefault((line.team, line.name, line.pool, line.capacity), []).append(line)
    return [_summed(lines) for lines in found.values()]


def devserver_lines(
    servers: Iterable[dict],
    flavors: dict[str, str],
    pricing: Pricing,
    since: datetime,
    until: datetime,
) -> list[Line]:
    """Per user: the running periods the operator recorded (devservers/savings.py), on the pool
    of each server's flavor (`flavors`: flavor -> pool, from the stack file)."""
    catalog = pricing.catalog
    found: dict[tuple[str, str, str], list[float]] = {}
    for server in servers:
        key = (
            server["metadata"]["namespace"],
            server["spec"]["owner"],
            flavors.get(server["spec"]["flavor"], ""),
        )
        for period in (server.get("status") or {}).get("usage") or []:
            if period["state"] != RUNNING:
                continue
            # `nodes` is the share of nodes the pods held, `usdPerHour` that share's price.
            spent = hours(period, since, until)
            gpus = max(
                (catalog[t].gpus for t in period["instanceType"].split("+") if t in catalog),
                default=0,
            )
            totals = found.setdefault(key, [0.0, 0.0, 0.0])
            totals[0] += spent * period["nodes"] * gpus
            totals[1] += spent * period["nodes"]
            totals[2] += spent * period.get("usdPerHour", 0)
    return [
        Line(namespace, "devserver", owner, pool, "list", gpu, node, usd)
        for (namespace, owner, pool), (gpu, node, usd) in sorted(found.items())
    ]


@dataclass(frozen=True)
class NodeSpan:
    """A pool's node, from when it was made to when it went (or the period's end)."""

    pool: str
    instance: str
    capacity: str
    start: datetime
    end: datetime


def live_nodes(nodes: Iterable[dict], until: datetime) -> list[NodeSpan]:
    """The pools' nodes that exist (the system nodes are the floor, no pool's)."""
    return [
        NodeSpan(
            labels(n)[POOL_LABEL],
            labels(n).get(INSTANCE_TYPE_LABEL, ""),
            labels(n).get(CAPACITY_TYPE_LABEL, ON_DEMAND),
            parse_timestamp(n["metadata"]["creationTimestamp"]),
            until,
        )
        for n in nodes
        if POOL_LABEL in labels(n)
    ]


def recorded_nodes(maps: list[dict], live: set[str]) -> list[NodeSpan]:
    """The usage recorder's nodes (usagerecorder/records.py) that are gone (`live`: the uids of
    those that exist)."""
    return [
        NodeSpan(
            r["pool"],
            r["instanceType"],
            r["capacity"],
            parse_timestamp(r["from"]),
            parse_timestamp(r["to"]),
        )  # fmt: skip
        for _, uid, r in entries(maps)
        if uid not in live
    ]


def node_lines(
    nodes: Iterable[NodeSpan], pricing: Pricing, since: datetime, until: datetime
) -> list[Line]:
    """Per pool and capacity type, the hours of the pool's nodes in the period."""
    found: dict[tuple[str, str], list[float]] = {}
    for node in nodes:
        spent = hours_between(node.start, node.end, since, until)
        rate = pricing.node(node.instance, node.capacity)
        totals = found.setdefault((node.pool, node.capacity), [0.0, 0.0, 0.0])
        kind = pricing.catalog.types.get(node.instance)
        totals[0] += spent * (kind.gpus if kind else 0)
        totals[1] += spent
        totals[2] += spent * (rate or 0)
    return [
        Line("", "nodes", pool, pool, capacity, gpu, node_hours, usd)
        for (pool, capacity), (gpu, node_hours, usd) in sorted(found.items())
    ]


def idle_lines(provisioned: list[Line], used: list[Line]) -> list[Line]:
    """Per pool: its nodes' hours less those jobs and DevServers were admitted for, at the
    pool's average rate over its nodes."""
    lines = []
    for pool in sorted({line.pool for line in provisioned}):
        mine = [line for line in provisioned if line.pool == pool]
        node_hours = sum(line.node_hours for line in mine)
        usd = sum(line.usd or 0 for line in mine)
        gpus = sum(line.gpu_hours for line in mine)
        admitted = sum(line.node_hours for line in used if line.pool == pool)
        admitted_gpus = sum(line.gpu_hours for line in used if line.pool == pool)
        idle = max(node_hours - admitted, 0.0)
        capacity = "+".join(sorted({line.capacity for line in mine}))
        lines.append(
            Line("", "idle", pool, pool, capacity, max(gpus - admitted_gpus, 0.0), idle,
                 usd * idle / node_hours if node_hours else 0.0)
        )  # fmt: skip
    return lines


def as_csv(lines: list[Line]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(Line.__dataclass_fields__))
    writer.writeheader()
    for line in lines:
        writer.writerow(asdict(line))
    return out.getvalue()


def as_json(lines: list[Line], meta: dict) -> str:
    return json.dumps({**meta, "lines": [asdict(line) for line in lines]}, indent=2)


def as_rows(lines: list[Line]) -> list[list[str]]:
    """A header, then each team's lines and its total, the total used, then the pools' nodes and
    their idle time."""
    rows = [["TEAM", "WHAT", "NAME", "POOL", "CAPACITY", "GPU-H", "NODE-H", "USD"]]
    used = [line for line in lines if line.what in ("job", "devserver")]
    for team in sorted({line.team for line in used}):
        mine = [line for line in used if line.team == team]
        rows += [_row(line) for line in mine]
        rows.append(_row(_total(mine, team, f"total {team}")))
    if used:
        rows.append(_row(_total(used, "", "total used")))
    return rows + [_row(line) for line in lines if line.what in ("nodes", "idle")]


def notes(meta: dict) -> list[str]:
    """Where the figures come from, under the table."""
    found = [f"{meta['since']} to {meta['until']}, {meta['scope']}", f"prices: {meta['prices']}"]
    if not meta["nodesRead"]:
        found.append(
            "nodes not readable with these rights: capacity `list`, the pool's cheapest type "
            "On-Demand; no idle line"
        )
    return found


def _total(lines: list[Line], team: str, name: str) -> Line:
    return _summed(lines, team=team, what="", name=name, pool="", capacity="")


def _summed(lines: list[Line], **fields) -> Line:
    """The first line with the hours and dollars of all (no dollars if none is priced), and
    `fields` set."""
    priced = [line.usd for line in lines if line.usd is not None]
    return replace(
        lines[0],
        gpu_hours=sum(line.gpu_hours for line in lines),
        node_hours=sum(line.node_hours for line in lines),
        usd=sum(priced) if priced else None,
        **fields,
    )


def _row(line: Line) -> list[str]:
    usd = "-" if line.usd is None else f"{line.usd:,.2f}"
    return [line.team, line.what, line.name, line.pool, line.capacity,
            f"{line.gpu_hours:,.2f}", f"{line.node_hours:,.2f}", usd]  # fmt: skip
