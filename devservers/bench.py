"""Benchmark: render and reconcile time per DevServer, for 100 servers (a benchmark, not a test).

    python -m devservers.bench [--servers 100]

Renders each server's children, then runs the operator's reconcile against the in-memory API
(devservers.fake_cluster): the first pass creates every child, the second finds nothing to do
(the steady state the timer sees). Times are the operator's own work; a real API server adds its
round trips (about seven reads per reconcile).
"""

import argparse
import statistics
import time
from datetime import UTC, datetime

from devservers.api import API_VERSION, flavor_object
from devservers.controller import reconcile
from devservers.fake_cluster import FakeCluster
from devservers.render import Settings, children

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBenchmarkKey bench@example"


def server(i: int) -> dict:
    distributed = i % 2 == 1
    spec = {
        "owner": f"user{i % 10}",
        "flavor": "gpu-4",
        "image": "repo/dev@sha256:" + "0" * 64,
        "mode": "distributed" if distributed else "standalone",
        "ssh": {"enabled": True, "authorizedKeys": [KEY], "serviceType": "ClusterIP"},
        "lifecycle": {"idleTimeout": "2h", "autoShutdown": True},
    }
    if distributed:
        spec["distributed"] = {"worldSize": 4, "backend": "nccl"}
    return {
        "apiVersion": API_VERSION,
        "kind": "DevServer",
        "metadata": {"name": f"box{i}", "namespace": f"dev-user{i % 10}", "uid": f"s-{i}"},
        "spec": spec,
    }


def per_server_ms(seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p95 = ms[int(len(ms) * 0.95) - 1]
    return f"median {statistics.median(ms):7.3f} ms   p95 {p95:7.3f} ms"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m devservers.bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--servers", type=int, default=100)
    args = parser.parse_args(argv)
    gpu = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    flavor = flavor_object(
        "gpu-4", "gpu-small", {"training-platform/pool": "gpu-small"}, [gpu], 4, 43, 163
    )
    servers = [server(i) for i in range(args.servers)]
    settings, now = Settings(), datetime.now(UTC)

    render = []
    for s in servers:
        start = time.perf_counter()
        children(s, flavor, settings)
        render.append(time.perf_counter() - start)

    cluster = FakeCluster()
    cluster.create(flavor)
    for s in servers:
        cluster.create(s)
    stored = [
        cluster.get(API_VERSION, "DevServer", s["metadata"]["name"], s["metadata"]["namespace"])
        for s in servers
    ]
    first, steady = [], []
    for s in stored:
        start = time.perf_counter()
        reconcile(cluster, s, settings, now)
        first.append(time.perf_counter() - start)
    cluster.settle()
    writes = len(cluster.writes)
    for s in stored:
        start = time.perf_counter()
        reconcile(cluster, s, settings, now, measure=True)
        steady.append(time.perf_counter() - start)
    print(f"{args.servers} DevServers (half standalone, half distributed x4), per server:")
    print(f"  render                        {per_server_ms(render)}")
    print(f"  reconcile, first (creates)    {per_server_ms(first)}")
    print(
        f"  reconcile, steady (+activity) {per_server_ms(steady)}   "
        f"writes: {len(cluster.writes) - writes}"
    )
    print(
        f"  total for all servers: render {sum(render) * 1000:.1f} ms, reconcile "
        f"{(sum(first) + sum(steady)) * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
