"""A week of DevServer users through the real operator, on the local Kubernetes API and the
test's clock: what idle stops save, against the nodes that really ran.

What is real: the operator's reconcile and idle checks (devservers.operator._refresh, as its
kopf handlers and its sweep call it), the usage record, the ledger and `devctl savings`; the API
server's RBAC, the StatefulSet controller and the kubelet of the local API (tests/kube_api); the
stack's plan (flavors, quotas, the pools' NodePools).

What stands in, written from upstream and kept simple:
- the user: for each user a list of busy spans (GPUs at 87 % while she works or trains, 1 %
  otherwise, read where the operator reads DCGM), when she arrives (`devctl start`, or creating
  the server the first time) and whether she stops it by hand when she leaves;
- kube-scheduler and Karpenter (`Karpenter` below): pods wait behind a scheduling gate until
  bound; a pod goes to the Ready node of its pool with room that has the most free CPU and memory
  (kube-scheduler's default NodeResourcesFit scoring: LeastAllocated, over cpu and memory with
  weight 1 and not GPUs, kubernetes pkg/scheduler/apis/config/v1/defaults.go
  defaultResourceSpec and pkg/scheduler/framework/plugins/noderesources/least_allocated.go),
  else to a node Karpenter launches of the pool's type (never past its NodePool's maxNodes),
  Ready after the stack's cold-start model (infra/karpenter/cold_start.py: launch, then the
  image pull onto the pool's disk); a node left empty for its NodePool's consolidateAfter is
  removed (GPU pools: WhenEmpty, 5 minutes, read from the plan); DevServer pods carry
  karpenter.sh/do-not-disrupt, so no node holding one is consolidated for underuse. Disruption
  budgets (one GPU node at a time) are not modelled: a removal takes no time here, so they would
  not delay one.
- the sweep's cadence: the operator checks every server every 60 s; here a server is checked at
  the moments its outcome can change (a user arrives, her GPUs go busy or quiet, the warning and
  the stop its status announces, a node it ran on goes), which gives the same outcomes to within
  one sweep.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from kubernetes.utils import parse_quantity

from devservers.api import API_VERSION, GPU, SERVER_LABEL, parse_timestamp, user_namespace
from devservers.controller import WARN_BEFORE
from devservers.tests.test_devservers_operator import World
from devservers.tests.test_devservers_render import server as server_manifest
from infra.core.catalog import load_catalog, load_prices
from infra.core.nodes import POOL_LABEL
from infra.karpenter.cold_start import IMAGES, launch_seconds, pull_seconds
from infra.stack.config import StackConfig

MONDAY = datetime(2026, 11, 23, tzinfo=UTC)
END = MONDAY + timedelta(days=7)
GATE = "sim.training-platform.io/scheduler"
BUSY, QUIET = 87.0, 1.0


@dataclass(frozen=True)
class User:
    """A DevServer user's week: `busy` spans in hours from Monday 00:00 (she is at her server or
    her training runs), the flavor and idle timeout of her one server, whether she stops it by
    hand when a working day ends, and whether auto-shutdown applies."""

    name: str
    flavor: str
    busy: tuple[tuple[float, float], ...]
    idle_timeout: str = "2h"
    by_hand: bool = False
    auto_shutdown: bool = True


def days(weekdays, *spans: tuple[float, float]) -> tuple[tuple[float, float], ...]:
    """The same hours of the day (`spans`, e.g. (9, 12), (13, 17.5)) on each of `weekdays`
    (0 = Monday)."""
    return tuple((24 * d + a, 24 * d + b) for d in weekdays for a, b in spans)


@dataclass
class Node:
    name: str
    pool: str
    instance_type: str
    capacity: dict[str, float]
    launched: datetime
    ready_at: datetime
    gone: datetime | None = None
    pods: set[str] = field(default_factory=set)  # namespace/name bound or reserved here
    requests: dict[str, dict[str, float]] = field(default_factory=dict)

    def free(self, resource: str) -> float:
        return self.capacity.get(resource, 0) - sum(
            r.get(resource, 0) for r in self.requests.values()
        )

    def fits(self, requests: dict[str, float]) -> bool:
        return all(self.free(k) >= v for k, v in requests.items())


class Karpenter:
    """kube-scheduler and Karpenter for the week's pods (see the module's docstring)."""

    def __init__(self, world: World, config: StackConfig, consolidate_after: dict[str, float]):
        self.world, self.catalog = world, load_catalog()
        self.pools = {p.name: p for p in config.node_pools}
        self.flavor_pools = {f.name: f.node_pool for f in config.dev_servers.flavors}
        self.consolidate_after = consolidate_after  # pool -> seconds
        self.prices = load_prices(config.region)
        self.nodes: list[Node] = []
        self._names = itertools.count(1)

    def cold_seconds(self, pool: str, instance: str) -> float:
        kind = self.catalog[instance]
        return launch_seconds(kind) + pull_seconds(IMAGES["runtime"], self.pools[pool], kind)

    def pending(self) -> list[dict]:
        reserved = {key for node in self.nodes for key in node.pods}
        return [
            p
            for p in self.world.api.objects("pods")
            if SERVER_LABEL in (p["metadata"].get("labels") or {})
            and not p["metadata"].get("deletionTimestamp")
            and not p["spec"].get("nodeName")
            and _key(p) not in reserved
        ]

    def place(self, now: datetime) -> list[Node]:
        """Bind the pending pods that fit on Ready nodes; launch nodes for the others. Returns
        the nodes launched (Ready later)."""
        launched = []
        for pod in self.pending():
            requests = _requests(pod)
            pool = self.flavor_pools[self._flavor(pod)]
            live = [n for n in self.nodes if n.pool == pool and n.gone is None and n.fits(requests)]
            ready = [n for n in live if n.ready_at <= now]
            if ready:
                node = max(ready, key=_least_allocated)
            elif live:  # an in-flight node with room: Karpenter counts it
                node = live[0]
            else:
                up = sum(1 for n in self.nodes if n.pool == pool and n.gone is None)
                # The NodePool's limit: Karpenter launches no more (the week is sized under it).
                assert up < self.pools[pool].max_nodes, f"{pool} at its limit of {up} nodes"
                instance = self.pools[pool].instance_types[0]
                kind = self.catalog[instance]
                wait = timedelta(seconds=self.cold_seconds(pool, instance))
                node = Node(
                    f"{pool}-{next(self._names)}",
                    pool,
                    instance,
                    {GPU: kind.gpus, "cpu": kind.vcpu, "memory": kind.memory_gib * 2**30},
                    now,
                    now + wait,
                )
                self.nodes.append(node)
                launched.append(node)
            node.pods.add(_key(pod))
            node.requests[_key(pod)] = requests
            if node.ready_at <= now:
                self._bind(pod, node)
        return launched

    def _flavor(self, pod: dict) -> str:
        server = self.world.server(
            pod["metadata"]["labels"][SERVER_LABEL], pod["metadata"]["namespace"]
        )
        return server["spec"]["flavor"]

    def node_ready(self, node: Node) -> None:
        """The node registers: the Node object, and its reserved pods bound."""
        kind = self.catalog[node.instance_type]
        labels = {
            "node.kubernetes.io/instance-type": node.instance_type,
            POOL_LABEL: node.pool,
            "karpenter.sh/capacity-type": "on-demand",
        }
        capacity = {GPU: str(kind.gpus), "cpu": str(kind.vcpu), "memory": f"{kind.memory_gib}Gi"}
        self._nodes().create(
            body={
                "metadata": {"name": node.name, "labels": labels},
                "status": {"capacity": capacity},
            }
        )
        pods = {_key(p): p for p in self.world.api.objects("pods")}
        for key in sorted(node.pods):
            if key in pods and not pods[key]["spec"].get("nodeName"):
                self._bind(pods[key], node)

    def release(self) -> list[Node]:
        """Forget pods that are gone; return the nodes left empty."""
        live = {_key(p) for p in self.world.api.objects("pods")}
        emptied = []
        for node in self.nodes:
            if node.gone is not None:
                continue
            gone = node.pods - live
            node.pods -= gone
            for key in gone:
                node.requests.pop(key, None)
            if gone and not node.pods:
                emptied.append(node)
        return emptied

    def consolidate(self, node: Node, now: datetime) -> bool:
        """Remove the node if it is still empty; True if it went."""
        if node.gone is not None or node.pods:
            return False
        node.gone = now
        self._nodes().delete(name=node.name)
        return True

    def node_hours(self, until: datetime) -> dict[str, float]:
        """Hours each instance type's nodes were up (billed from launch), to `until`."""
        found: dict[str, float] = {}
        for node in self.nodes:
            end = min(node.gone or until, until)
            hours = max((end - node.launched).total_seconds(), 0) / 3600
            found[node.instance_type] = found.get(node.instance_type, 0.0) + hours
        return found

    def bill(self, until: datetime) -> float:
        """What the nodes cost at the stack's On-Demand list prices."""
        return sum(h * self.prices.instance(t) for t, h in self.node_hours(until).items())

    def _bind(self, pod: dict, node: Node) -> None:
        body = [
            {"op": "remove", "path": "/spec/schedulingGates"},
            {"op": "add", "path": "/spec/nodeName", "value": node.name},
        ]
        self._pods().patch(
            name=pod["metadata"]["name"],
            namespace=pod["metadata"]["namespace"],
            body=body,
            content_type="application/json-patch+json",
        )

    def _nodes(self):
        return self.world.admin.resources.get(api_version="v1", kind="Node")

    def _pods(self):
        return self.world.admin.resources.get(api_version="v1", kind="Pod")


def _key(pod: dict) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def _requests(pod: dict) -> dict[str, float]:
    requests = pod["spec"]["containers"][0].get("resources", {}).get("requests") or {}
    return {k: float(parse_quantity(v)) for k, v in requests.items() if k in (GPU, "cpu", "memory")}


def _least_allocated(node: Node) -> float:
    return (
        node.free("cpu") / node.capacity["cpu"] + node.free("memory") / node.capacity["memory"]
    ) / 2


class Week:
    """The event loop: user arrivals and departures, the operator's checks, nodes coming and
    going, in time order."""

    def __init__(self, world: World, users: list[User], karpenter: Karpenter):
        self.world, self.users, self.karpenter = world, {u.name: u for u in users}, karpenter
        self.queue: list[tuple[datetime, int, str, object]] = []
        self._order = itertools.count()
        self.refreshes = 0
        self.clients = {}
        self.restarts: list[tuple[str, datetime]] = []  # (user, when): starts after idle stops
        world.api.admission.append(self._gate)
        world.memo.cluster.gpu_utilization = self._gpu

    def _gate(self, kind, obj) -> None:
        if kind.kind == "Pod" and SERVER_LABEL in (obj["metadata"].get("labels") or {}):
            obj["spec"]["schedulingGates"] = [{"name": GATE}]

    def _gpu(self, namespace: str, pods) -> float:
        return BUSY if self._busy(namespace.removeprefix("dev-"), self.world.clock) else QUIET

    def _busy(self, name: str, moment: datetime) -> bool:
        hour = (moment - MONDAY).total_seconds() / 3600
        return any(a <= hour <= b for a, b in self.users[name].busy)

    def at(self, when: datetime, what: str, subject) -> None:
        heapq.heappush(self.queue, (when, next(self._order), what, subject))

    def run(self) -> None:
        for user in self.users.values():
            for a, b in user.busy:
                self.at(MONDAY + timedelta(hours=a), "arrive", user.name)
                self.at(MONDAY + timedelta(hours=b), "leave", user.name)
        seen = set()
        while self.queue and self.queue[0][0] <= END:
            when, _, what, subject = heapq.heappop(self.queue)
            if (when, what, getattr(subject, "name", subject)) in seen:
                continue
            seen.add((when, what, getattr(subject, "name", subject)))
            self.world.clock = when
            getattr(self, f"_{what}")(subject)
        self.world.clock = END

    # what happens

    def _arrive(self, name: str) -> None:
        server = self._server(name)
        if server and not server["spec"].get("stopped") and not self.users[name].auto_shutdown:
            return  # running, and no check can stop it
        if server is None:
            self._create(self.users[name])
        elif server["spec"].get("stopped"):
            if (server.get("status") or {}).get("reason") == "Idle":
                self.restarts.append((name, self.world.clock))
            self._patch(name, {"spec": {"stopped": False}})
        self._check(name)

    def _leave(self, name: str) -> None:
        user = self.users[name]
        if user.auto_shutdown:
            self._check(name)  # the last check that sees her GPUs busy
        hour = (self.world.clock - MONDAY).total_seconds() / 3600
        day_ends = not any(hour < a < 24 * (hour // 24 + 1) for a, _ in user.busy)
        if user.by_hand and day_ends and not self._stopped(name):
            self._patch(name, {"spec": {"stopped": True}})  # devctl stop
            self._check(name, measure=False)

    def _node_ready(self, node: Node) -> None:
        self.karpenter.node_ready(node)
        self.world.api.settle()
        for key in sorted(node.pods):
            self._check(key.split("/")[0].removeprefix("dev-"), measure=False)

    def _consolidate(self, node: Node) -> None:
        if self.karpenter.consolidate(node, self.world.clock):
            # The operator's sweep sees the node gone at its next check of each stopped server.
            for user in sorted(self._ran_on(node.name)):
                self._check(user, measure=False)

    def _check(self, name: str, measure: bool = True) -> None:
        """The operator's reconcile of the user's server (with an activity check when
        `measure`), the writes it leads to (a stop, pods going, pods bound), Karpenter's moves,
        and the checks its status announces (the warning, the stop)."""
        before = self._server(name)
        self._refresh(name, measure)
        if self._server(name)["spec"].get("stopped") and not before["spec"].get("stopped"):
            self._refresh(name)  # the spec change the operator made, seen by its kopf handler
        for node in self.karpenter.place(self.world.clock):
            self.at(node.ready_at, "node_ready", node)
        self.world.api.settle()
        if self._phase(name) != ("Stopped" if self._stopped(name) else "Running"):
            self._refresh(name)  # the pod events' reconcile: pods gone, or bound and ready
        for node in self.karpenter.release():
            seconds = self.karpenter.consolidate_after[node.pool]
            self.at(self.world.clock + timedelta(seconds=seconds), "consolidate", node)
        stop_at = (self._server(name).get("status") or {}).get("idleStopAt")
        if stop_at and not self._stopped(name):
            stop = parse_timestamp(stop_at)
            for moment in (stop - WARN_BEFORE, stop):
                # While she is busy a check only moves the stop on; her leaving checks anyway.
                if moment > self.world.clock and not self._busy(name, moment):
                    self.at(moment, "check", name)

    # helpers

    def _refresh(self, name: str, measure: bool = False) -> None:
        self.refreshes += 1
        self.world.refresh("box", measure=measure, namespace=user_namespace(name))

    def _phase(self, name: str) -> str | None:
        return (self._server(name).get("status") or {}).get("phase")

    def _stopped(self, name: str) -> bool:
        return bool(self._server(name)["spec"].get("stopped"))

    def _server(self, name: str) -> dict | None:
        return self.world.dev_cluster.server("box", user_namespace(name))

    def _create(self, user: User) -> None:
        manifest = server_manifest(
            owner=user.name,
            flavor=user.flavor,
            lifecycle={"idleTimeout": user.idle_timeout, "autoShutdown": user.auto_shutdown},
        )
        manifest["metadata"] = {"name": "box", "namespace": user_namespace(user.name)}
        self._servers(user.name).create(body=manifest, namespace=user_namespace(user.name))

    def _patch(self, name: str, body: dict) -> None:
        self._servers(name).patch(
            name="box",
            namespace=user_namespace(name),
            body=body,
            content_type="application/merge-patch+json",
        )

    def _servers(self, name: str):
        """The DevServer resource as the user reaches it (her rights, one client each)."""
        if name not in self.clients:
            self.clients[name] = self.world.dev_cluster.client(name)
        return self.clients[name].resources.get(api_version=API_VERSION, kind="DevServer")

    def _ran_on(self, node: str) -> set[str]:
        """Users whose server's last period names `node`."""
        found = set()
        for name in self.users:
            usage = ((self._server(name) or {}).get("status") or {}).get("usage") or []
            if usage and node in usage[-1].get("nodeNames", []):
                found.add(name)
        return found
