"""The operator's Prometheus metrics: idle stops and restarts, what each server holds or saves
now, and how long an idle check of every server takes. Served on DEVSERVERS_METRICS_PORT
(/metrics, the Prometheus text format of prometheus_client)."""

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from devservers.savings import IDLE_STOPPED

KIND = ["namespace", "flavor", "instance_type"]
SERVER = ["namespace", "server", "flavor", "instance_type", "state"]


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.idle_stops = Counter(
            "devserver_idle_stops",
            "DevServers stopped for idleness",
            KIND,
            registry=self.registry,
        )
        self.idle_restarts = Counter(
            "devserver_idle_restarts",
            "DevServers started again after an idle stop",
            KIND,
            registry=self.registry,
        )
        self.nodes = Gauge(
            "devserver_nodes",
            "Node-equivalents a server holds (state running) or an idle stop leaves unused "
            "(state idle_stopped)",
            SERVER,
            registry=self.registry,
        )
        self.usd_per_hour = Gauge(
            "devserver_usd_per_hour",
            "List price per hour of what a server holds (running) or an idle stop saves "
            "(idle_stopped)",
            SERVER,
            registry=self.registry,
        )
        self.check_seconds = Gauge(
            "devserver_idle_check_seconds",
            "How long the last idle check of every server took",
            registry=self.registry,
        )
        self.checked = Gauge(
            "devserver_idle_check_servers",
            "Servers the last idle check looked at",
            registry=self.registry,
        )
        self._shown: dict[tuple[str, str], tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)

    def observe(self, server: dict, usage: list[dict], events: list[tuple[str, str, str]]) -> None:
        """Count a server's idle stops and restarts (its new Events) and show its open usage
        period, if any."""
        meta, flavor = server["metadata"], server["spec"]["flavor"]
        key = (meta["namespace"], meta["name"])
        # The period an idle stop opened, or the one a restart closed: the nodes it is about.
        kind = usage[-1]["instanceType"] if usage else "unknown"
        last = usage[-1] if usage and not usage[-1].get("end") else None
        for _, reason, _ in events:
            counter = {"IdleStop": self.idle_stops, "IdleRestart": self.idle_restarts}.get(reason)
            if counter is not None:
                counter.labels(meta["namespace"], flavor, kind).inc()
        state = "idle_stopped" if last and last["state"] == IDLE_STOPPED else "running"
        labels = (*key, flavor, kind, state) if last else None
        with self._lock:
            self._forget(key, keep=labels)
            if labels is not None:
                self._shown[key] = labels
                self.nodes.labels(*labels).set(last["nodes"])
                if "usdPerHour" in last:
                    self.usd_per_hour.labels(*labels).set(last["usdPerHour"])

    def retain(self, servers: set[tuple[str, str]]) -> None:
        """Drop the series of servers that are gone."""
        with self._lock:
            for key in set(self._shown) - servers:
                self._forget(key)

    def _forget(self, key: tuple[str, str], keep: tuple[str, ...] | None = None) -> None:
        labels = self._shown.get(key)
        if labels is None or labels == keep:
            return
        del self._shown[key]
        self.nodes.remove(*labels)
        self.usd_per_hour.remove(*labels)
