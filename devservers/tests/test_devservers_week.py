"""Twenty users' week through the real operator (devservers/tests/week_simulation.py says what is
real and what stands in): the idle stops it makes and must not make, what a stop costs the user
who comes back, `devctl savings` in both views, and the bill of the nodes that really ran against
the same week with auto-shutdown off. docs/platform/idle-savings.md shows the summary; the last
test keeps the two equal."""

import io
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from devservers import cli
from devservers.activity import parse_duration
from devservers.api import parse_timestamp, user_namespace
from devservers.savings import IDLE_STOPPED, RUNNING, STOPPED
from devservers.tests.test_devservers_operator import World
from devservers.tests.week_simulation import END, MONDAY, Karpenter, User, Week, days
from infra.stack.loading import parse_stack_config
from tests.plugin import ROOT, local_cluster, plan_of, stack_values

DOCS = ROOT / "docs" / "platform" / "idle-savings.md"
WORKDAYS = range(5)
OFFICE = days(WORKDAYS, (9, 12), (13, 17.5))
USERS = [
    # Lunch shorter than the idle timeout: never stopped at lunch.
    User("u01", "gpu-1", OFFICE),
    User("u02", "gpu-1", OFFICE),
    User("u07", "gpu-1", days(WORKDAYS, (8, 12), (12.75, 16)), "1h"),
    User("u08", "gpu-1", days(WORKDAYS, (8, 12), (12.75, 16)), "1h"),
    # Lunch longer than the idle timeout: stopped at lunch, started again after it.
    User("u03", "gpu-1", OFFICE, "30m"),
    User("u04", "gpu-1", OFFICE, "30m"),
    User("u05", "gpu-1", days(WORKDAYS, (9, 12.5), (14, 18)), "1h"),
    User("u06", "gpu-1", days(WORKDAYS, (9, 12.5), (14, 18)), "1h"),
    # Training every night from Monday to Thursday, 18:00 to 06:00: never to be stopped.
    User("u09", "gpu-4", days(WORKDAYS, (9, 12), (13, 18)) + days(range(4), (18, 30))),
    User("u10", "gpu-4", days(WORKDAYS, (9, 12), (13, 18)) + days(range(4), (18, 30))),
    # Tuesday to Saturday, and Sunday afternoon.
    User("u11", "gpu-1", days(range(1, 6), (10, 16)) + days([6], (12, 15)), "1h"),
    User("u12", "gpu-1", days(range(1, 6), (10, 16)) + days([6], (12, 15)), "1h"),
    # `devctl stop` when they leave.
    User("u13", "gpu-1", OFFICE, by_hand=True),
    User("u14", "gpu-1", OFFICE, by_hand=True),
    # Forgotten: Monday only, then on leave.
    User("u15", "gpu-4", days([0], (9, 17))),
    # Large servers on p4d: two office weeks, a night's training on Tuesday, and a conference
    # from Thursday.
    User("u16", "a100-8", days(WORKDAYS, (9, 12), (13, 17))),
    User("u17", "a100-8", days(WORKDAYS, (9, 12), (13, 17))),
    User("u18", "a100-8", days(WORKDAYS, (10, 16)) + days([1], (16, 32)), "1h"),
    User("u19", "a100-8", days(range(3), (9, 17))),
    # Opted out.
    User("u20", "gpu-1", days(WORKDAYS, (9, 17)), auto_shutdown=False),
]
GPUS = {"gpu-1": 1, "gpu-4": 4, "a100-8": 8}


def sections() -> dict:
    """The dev stack with the week's users, and room in gpu-small for all their servers at once
    (13 gpu-1 and 3 gpu-4 servers: up to 7 g5.12xlarge)."""
    pools = stack_values("dev")["training-platform:nodePools"]
    users = [
        {
            "name": u.name,
            "email": f"{u.name}@example.com",
            "team": "team-a" if int(u.name[1:]) % 2 else "research",
            "quota": {"servers": 1, "gpus": GPUS[u.flavor]},
            "iamPrincipalArn": f"arn:aws:iam::123456789012:role/dev-{u.name}",
        }
        for u in USERS
    ]
    return {
        "nodePools": [{**p, "maxNodes": 8} if p["name"] == "gpu-small" else p for p in pools],
        "devServers": {"users": users},
    }


@dataclass
class Outcome:
    usage: dict[str, list[dict]]  # user -> her server's usage record at the week's end
    restarts: list[tuple[str, float]]  # (user, hour) starts after an idle stop
    report: str  # devctl savings -A over the week
    node_hours: dict[str, float]
    bill: float
    cold_minutes: dict[str, float]  # pool -> minutes a start waits for a new node
    refreshes: int


def run_week(tmp_path: Path, auto_shutdown: bool) -> Outcome:
    plan = plan_of("dev", **sections())
    config = parse_stack_config(stack_values("dev", **sections()), "Pulumi.dev.yaml")
    consolidate_after = {}
    for pool in plan.of_type("kubernetes:karpenter.sh/v1:NodePool"):
        disruption = pool.inputs["spec"]["disruption"]
        consolidate_after[pool.inputs["metadata"]["name"]] = parse_duration(
            disruption["consolidateAfter"]
        )
    users = [u if auto_shutdown else replace(u, auto_shutdown=False) for u in USERS]
    with pytest.MonkeyPatch.context() as monkeypatch:
        clusters = local_cluster(plan, tmp_path, monkeypatch)
        cluster = next(clusters)
        world = World(cluster, monkeypatch, user="u01")
        karpenter = Karpenter(world, config, consolidate_after)
        week = Week(world, users, karpenter)
        week.run()
        out = io.StringIO()
        monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfigs["admin"]))
        assert cli.main(["savings", "--since", "7d", "-A"], out=out) == 0
        usage = {
            u.name: cluster.server("box", user_namespace(u.name))["status"]["usage"] for u in USERS
        }
        assert world.api.refusals == []
        next(clusters, None)  # closes the cluster
    return Outcome(
        usage,
        [(name, hours(when)) for name, when in week.restarts],
        out.getvalue(),
        karpenter.node_hours(END),
        karpenter.bill(END),
        {
            pool: karpenter.cold_seconds(pool, config.pool_named(pool).instance_types[0]) / 60
            for pool in ("gpu-small", "gpu-large")
        },
        week.refreshes,
    )


@pytest.fixture(scope="module")
def weeks(tmp_path_factory) -> dict[bool, Outcome]:
    """The week with auto-shutdown, and without (every server autoShutdown: false)."""
    return {on: run_week(tmp_path_factory.mktemp(f"on-{on}"), on) for on in (True, False)}


def merged(spans) -> list[tuple[float, float]]:
    """Busy spans in order, those that touch or overlap joined."""
    found: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if found and a <= found[-1][1]:
            found[-1] = (found[-1][0], max(found[-1][1], b))
        else:
            found.append((a, b))
    return found


def hours(moment) -> float:
    return (moment - MONDAY).total_seconds() / 3600


def periods(outcome: Outcome, user: str, state: str) -> list[tuple[float, float | None]]:
    """(start, end or None) of the user's periods in `state`, in hours from Monday 00:00."""
    found = []
    for period in outcome.usage[user]:
        if period["state"] == state:
            end = period.get("end")
            found.append(
                (hours(parse_timestamp(period["start"])), end and hours(parse_timestamp(end)))
            )
    return found


def test_every_idle_stop_comes_its_timeout_after_the_last_use_and_never_during_use(weeks):
    on = weeks[True]
    for user in USERS:
        stops = [start for start, _ in periods(on, user.name, IDLE_STOPPED)]
        timeout = parse_duration(user.idle_timeout) / 3600
        for stop in stops:
            assert not any(a <= stop <= b for a, b in user.busy), (user.name, stop)
            last_use = max(b for _, b in user.busy if b <= stop)
            assert stop == last_use + timeout, (user.name, stop)
        # Every quiet spell longer than the timeout ends in a stop; no other does.
        spans = merged(user.busy)
        gaps = zip(spans, [*spans[1:], (168, 168)], strict=True)
        quiet = [b + timeout for (_, b), (a, _) in gaps if a - b > timeout]
        assert stops == ([] if user.by_hand or not user.auto_shutdown else quiet), user.name
    # Counted by hand: the training users' nights pass, each stop comes two hours after the run
    # (Tuesday to Friday 08:00) and on Friday at 20:00.
    assert [s for s, _ in periods(on, "u09", IDLE_STOPPED)] == [32, 56, 80, 104, 116]
    assert [s for s, _ in periods(on, "u13", STOPPED)] == [17.5, 41.5, 65.5, 89.5, 113.5]
    assert periods(on, "u20", IDLE_STOPPED) == [] and weeks[False].restarts == []


def false_stops(outcome: Outcome) -> list[tuple[str, float]]:
    """Idle stops whose user came back the same day: a break, not the end of her work."""
    found = []
    for user in USERS:
        for stop, end in periods(outcome, user.name, IDLE_STOPPED):
            if end is not None and end // 24 == stop // 24:
                found.append((user.name, stop))
    return found


def waits(outcome: Outcome) -> list[float]:
    """Minutes each start after an idle stop waited for its server to run again."""
    found = []
    for name, start in outcome.restarts:
        running = min(s for s, _ in periods(outcome, name, RUNNING) if s >= start)
        found.append((running - start) * 60)
    return found


def test_breaks_longer_than_the_timeout_cost_a_stop_and_a_start(weeks):
    on = weeks[True]
    by_user = {}
    for name, stop in false_stops(on):
        by_user.setdefault(name, []).append(stop % 24)
    # Lunch longer than the timeout, every working day; the night trainers' mornings (the run
    # ends at 06:00, they come at 09:00); u18's Wednesday morning after her night's run.
    assert by_user == {
        "u03": [12.5] * 5, "u04": [12.5] * 5, "u05": [13.5] * 5, "u06": [13.5] * 5,
        "u09": [8.0] * 4, "u10": [8.0] * 4, "u18": [9.0],
    }  # fmt: skip
    # Each start after an idle stop either finds room on a node still up (no wait) or waits for
    # a node: the cold-start model's launch and image pull on the pool's type.
    # (Seconds: the usage record's times are whole seconds.)
    cold = {int(m * 60) for m in on.cold_minutes.values()}
    assert {round(w * 60) for w in waits(on)} <= {0} | cold
    assert 2 < on.cold_minutes["gpu-small"] < on.cold_minutes["gpu-large"] < 10


def report_total(report: str) -> list[str]:
    """The cells of `devctl savings`'s total line."""
    return next(line.split() for line in report.splitlines() if line.startswith("total"))


def summary(on: Outcome, off: Outcome) -> str:
    """The week in figures, as docs/platform/idle-savings.md shows them."""
    waited = waits(on)
    cold = [w for w in waited if w > 0]
    stops = sum(len(periods(on, u.name, IDLE_STOPPED)) for u in USERS)
    rows = [
        ("", "auto-shutdown", "off"),
        ("---", "---", "---"),
        *(
            (f"{kind} node-hours", f"{on.node_hours[kind]:.1f}", f"{off.node_hours[kind]:.1f}")
            for kind in sorted(on.node_hours)
        ),
        ("nodes billed, On-Demand list", f"${on.bill:,.0f}", f"${off.bill:,.0f}"),
        ("saved on the nodes' bill", f"{1 - on.bill / off.bill:.1%}", ""),
        ("`devctl savings` SAVED (share view)", report_total(on.report)[6], ""),
        ("`devctl savings` NODE VIEW", report_total(on.report)[8], ""),
        ("idle stops", str(stops), "0"),
        ("of which false (the user came back the same day)", str(len(false_stops(on))), ""),
        ("starts after an idle stop", str(len(waited)), ""),
        ("of which onto a node still up (no wait)", str(len(waited) - len(cold)), ""),
        ("of which waiting for a new node", f"{len(cold)} ({sum(cold):.0f} min in all)", ""),
    ]
    return "\n".join(f"| {' | '.join(row)} |" for row in rows)


def test_the_week_in_figures_is_what_the_docs_show(weeks):
    on, off = weeks[True], weeks[False]
    text = summary(on, off)
    print(text, on.refreshes, off.refreshes, sep="\n")
    # Auto-shutdown cut the bill; the report, counting each stop's first 8 hours only, claims
    # less than the bill shows, and the node view no more than the share view.
    totals = report_total(on.report)
    share, node = float(totals[6].rstrip("%")), float(totals[8].rstrip("%"))
    assert off.bill > on.bill and node <= share < (1 - on.bill / off.bill) * 100
    assert text in DOCS.read_text(), f"docs/platform/idle-savings.md should show:\n{text}"
