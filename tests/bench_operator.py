"""Benchmark: the real DevServers operator (kopf, as its image runs it, with the dev plan's
Deployment args, env and RBAC) against the local Kubernetes API (tests.kube_api), whose kubelet
runs every server's pod as processes of its own, with many servers and some whose shell hangs.

    .venv/bin/python -m tests.bench_operator [--servers 1000] [--hung 10] [--users 20]

A benchmark, not a test: it prints figures and asserts nothing about time. What it does:
1. plans the dev stack with `--users` users (namespaces dev-u00...), starts the local API with
   the plan's RBAC, and creates `--servers` cpu-small DevServers spread over the users, with the
   operator down;
2. starts the operator and times its cold start: every server rendered (its StatefulSet made
   and a phase in its status) and every server Running (its pod started by the local kubelet);
3. gives `--hung` servers (1 %) a shell that never answers (the probe's `cat`, first on the
   pod's PATH, sleeps), then times a whole idle check of all servers, hung ones included (the
   operator logs each check's duration);
4. creates `--extra` more servers one every 0.2 s with the operator warm and times each from
   its creation to its StatefulSet's (create-to-rendered), p50 and p99.
"""

import argparse
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from devservers.api import API_VERSION, GROUP, user_namespace
from devservers.tests.test_devservers_render import IMAGE, KEY
from tests.devservers_cluster import Cluster, wait_for
from tests.kube_api.kubelet import IMAGE_BIN
from tests.plugin import plan_of

HANDLED = f"{GROUP}/last-handled-configuration"  # kopf's diff-base, AnnotationsDiffBaseStorage
CHECK = re.compile(r"idle check of (\d+) servers took ([0-9.]+) s")
HANGS = "#!/bin/sh\nexec sleep 3600\n"
CHECK_SECONDS = 15  # between idle checks (the platform's is 60)


def users(count: int, servers: int) -> list[dict]:
    per_user = math.ceil(servers / count)
    return [
        {
            "name": f"u{i:02d}",
            "email": f"u{i:02d}@example.com",
            "team": "team-a",
            "quota": {"servers": min(per_user + 10, 100), "gpus": 0},
            "iamPrincipalArn": f"arn:aws:iam::123456789012:role/dev-u{i:02d}",
        }
        for i in range(count)
    ]


def manifest(owner: str, name: str) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "DevServer",
        "metadata": {"name": name, "namespace": user_namespace(owner)},
        "spec": {
            "owner": owner,
            "flavor": "cpu-small",
            "image": IMAGE,
            "ssh": {"authorizedKeys": [KEY]},
        },
    }


class Bench:
    def __init__(self, cluster: Cluster):
        self.cluster, self.api = cluster, cluster.api
        self.created: dict[tuple[str, str], float] = {}  # DevServer -> when created
        self.rendered: dict[tuple[str, str], float] = {}  # its StatefulSet -> when created
        self.api.admission.append(self._clock)
        self.servers_kind = next(k for k in self.api.kinds.values() if k.kind == "DevServer")

    def _clock(self, kind, obj) -> None:
        """An admission hook on the API's loop: when each DevServer and StatefulSet came."""
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"]) if kind.namespaced else None
        if kind.kind == "DevServer":
            self.created[key] = time.monotonic()
        elif kind.kind == "StatefulSet":
            self.rendered.setdefault(key, time.monotonic())

    def create(self, owner: str, name: str) -> None:
        self.api.call(
            self.api.create, self.servers_kind, user_namespace(owner), manifest(owner, name)
        )

    def phases(self) -> dict[tuple[str, str], str]:
        return self.api.call(
            lambda: {
                (o["metadata"]["namespace"], o["metadata"]["name"]): (o.get("status") or {}).get(
                    "phase", ""
                )
                for o in self.api.select(self.servers_kind)
            }
        )

    def handled(self) -> set[tuple[str, str]]:
        """The servers kopf has run its create (or resume) handler for: it records the spec it
        handled in an annotation once they succeed."""
        return self.api.call(
            lambda: {
                (o["metadata"]["namespace"], o["metadata"]["name"])
                for o in self.api.select(self.servers_kind)
                if HANDLED in (o["metadata"].get("annotations") or {})
            }
        )

    def quiet(self, cluster: Cluster, seconds: float = 10) -> None:
        """Wait until kopf has logged no handler for `seconds` (its queue of pod events from the
        cold start is done)."""

        def handlers() -> int:
            return cluster.operator_log.read_text().count("Handler '")

        last, since = handlers(), time.monotonic()
        while time.monotonic() - since < seconds:
            time.sleep(1)
            if (now := handlers()) != last:
                last, since = now, time.monotonic()

    def checks(self) -> list[tuple[int, float]]:
        log = self.cluster.operator_log.read_text()
        return [(int(n), float(s)) for n, s in CHECK.findall(log)]


def cpu_seconds(operator: int) -> tuple[float, float, float]:
    """CPU seconds so far of the operator process, of this one (the local API and its kubelet),
    and of this one's finished children (the commands exec'd into the pods)."""
    fields = Path(f"/proc/{operator}/stat").read_text().rpartition(")")[2].split()
    mine = os.times()
    return (
        (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
        mine.user + mine.system,
        mine.children_user + mine.children_system,
    )


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(round(share * (len(ordered) - 1))), len(ordered) - 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--hung", type=int, default=10)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--extra", type=int, default=100)
    args = parser.parse_args()
    owners = [u["name"] for u in users(args.users, args.servers)]
    started = time.monotonic()
    plan = plan_of("dev", devServers={"users": users(args.users, args.servers)})
    print(f"planned the dev stack with {args.users} users in {time.monotonic() - started:.0f} s")
    directory = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    cluster = Cluster(plan, directory)
    bench = Bench(cluster)
    try:
        names = [(owners[i % len(owners)], f"s{i:04d}") for i in range(args.servers)]
        for owner, name in names:
            bench.create(owner, name)
        keys = {(user_namespace(o), n) for o, n in names}
        print(f"created {len(keys)} DevServers with the operator down")

        start = time.monotonic()
        cluster.start_operator(DEVSERVERS_IDLE_CHECK_SECONDS=str(CHECK_SECONDS))

        def all_reconciled() -> bool:
            phases = bench.phases()
            return keys <= set(bench.rendered) and all(phases[k] for k in keys)

        wait_for(all_reconciled, "every server rendered", timeout=3600)
        rendered = time.monotonic() - start
        print(f"cold start: all {len(keys)} rendered (StatefulSet and status) in {rendered:.1f} s")
        wait_for(lambda: bench.handled() >= keys, "kopf's create handler of every server", 3600)
        handled = time.monotonic() - start
        print(
            f"cold start: all {len(keys)} handled by kopf (create handler done) in {handled:.1f} s"
        )
        wait_for(
            lambda: all(p == "Running" for k, p in bench.phases().items() if k in keys),
            "every server Running",
            timeout=3600,
        )
        running = time.monotonic() - start
        print(f"cold start: all {len(keys)} Running (pods started) in {running:.1f} s")
        bench.quiet(cluster)
        print(
            f"cold start: the operator's handlers all done after {time.monotonic() - start:.1f} s"
        )

        hung = sorted(keys)[:: max(len(keys) // max(args.hung, 1), 1)][: args.hung]
        for namespace, name in hung:
            pod = cluster.api.read("pods", namespace, f"{name}-0")
            cluster.api.runtime.write(pod, f"{IMAGE_BIN}/cat", HANGS)
        done = len(bench.checks())
        print(f"{len(hung)} servers' shells hang from now: {', '.join(n for _, n in hung)}")
        # The next check may have started before the shells hung: the one after it is timed,
        # with the CPU each side used from the end of the one before (a pause, then the check).
        wait_for(lambda: len(bench.checks()) >= done + 1, "an idle check", timeout=3600)
        before = cpu_seconds(cluster.operator.pid)
        wait_for(lambda: len(bench.checks()) >= done + 2, "two idle checks", timeout=3600)
        after = cpu_seconds(cluster.operator.pid)
        checked, took = bench.checks()[done + 1]
        print(f"idle check: {checked} servers, {len(hung)} hung, in {took:.1f} s")
        print(
            f"  CPU meanwhile: operator {after[0] - before[0]:.1f} s, local API and kubelet "
            f"{after[1] - before[1]:.1f} s, the pods' exec'd commands {after[2] - before[2]:.1f} s"
        )

        extra = [(owners[i % len(owners)], f"x{i:04d}") for i in range(args.extra)]
        for owner, name in extra:
            bench.create(owner, name)
            time.sleep(0.2)
        extra_keys = {(user_namespace(o), n) for o, n in extra}
        wait_for(lambda: extra_keys <= set(bench.rendered), "the extra servers rendered", 3600)
        latencies = [bench.rendered[k] - bench.created[k] for k in extra_keys]
        print(
            f"create-to-rendered over {len(extra_keys)} servers created one every 0.2 s beside "
            f"{len(keys)}: p50 {percentile(latencies, 0.5):.2f} s, "
            f"p99 {percentile(latencies, 0.99):.2f} s (mean {statistics.mean(latencies):.2f} s)"
        )
        print(
            f"measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.machine()}, "
            f"{len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}, "
            f"load average {os.getloadavg()[0]:.1f} (other work on the machine included); "
            f"operator log: {cluster.operator_log}"
        )
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
