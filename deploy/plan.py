"""Offline plan, the `cdk synth` Pulumi lacks: run the program under mocks, write what it declares.

    python -m deploy.plan --stack dev [--out build/plan/dev] [--against DIR | --against-ref REF]

writes `plan.json` (one object per registered resource), `outputs.json` (the stack's outputs),
`manifests/` (one YAML file per Kubernetes object), `facts.json` (limits, quotas, sizes, cost) and
`changes.txt`, then prints a summary led by NodePools and cost, and what the change does to what
exists: against the previous plan in the out folder, the plan in DIR, or the stack as git REF
would deploy it (its code and stack file). Data lost without the stack file's acknowledgement
fails the plan (exit 1), as a mandatory policy does; invalid stack config exits 2.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deploy.day_two import consequences
from deploy.plan_changes import Facts, changes, plan_facts
from deploy.program import build_platform
from devservers.api import user_namespace
from infra.core.bill import StackCost, money
from infra.core.capacity import SystemFit
from infra.core.catalog import HOURS_PER_MONTH
from infra.core.config import ConfigError
from infra.core.declared import Declared, declared_in, dig, listed
from infra.core.offline import Plan, RecordedResource, run_offline
from infra.core.paths import PROJECT_DIR
from infra.core.releases import VERSIONS_OUTPUT, moves
from infra.core.versions import KUBERNETES_VERSIONS
from infra.eks.support import PLAN_DAY_VARIABLE, plan_day, support_on
from infra.integrations import plan_cost, plan_steps, system_fit
from infra.jobs.expected import Expected, expected_cost
from infra.jobs.usage import UsageLine, usage_lines
from infra.karpenter.cold_start import (
    MARGIN,
    SPOT_NOTICE_S,
    cold_start,
    duration,
    pods_ready_timeouts,
)
from infra.kueue.queues import PLATFORM_QUEUE, team_cluster_queue
from infra.operators.retirement import pytorchjob_warning
from infra.stack.config import StackConfig
from infra.stack.loading import load_stack_file, read_stack_file
from infra.stack.policy import placeholder_errors
from infra.storage.lustre import CHECKPOINTS_CLAIM as FSX_CHECKPOINTS_CLAIM
from infra.storage.lustre import DATASETS_CLAIM as FSX_DATASETS_CLAIM
from infra.storage.shared_file_system import CLAIM as EFS_CLAIM
from policies.offline import check
from policies.pack_config import policy_settings
from policies.rules.cost import ceiling_rise
from workloads.stack_code import runs

FACTS_FILE = "facts.json"
CHANGES_FILE = "changes.txt"
PLAN_FILE = "plan.json"
OUTPUTS_FILE = "outputs.json"
STACK_FILE = "stack.json"
# In the out folder: the last plan that passed, which the next plan there is compared with (a
# refused plan is written beside it, but never becomes the base: its refusal stands).
BASE_DIR = "base"

# Kubernetes types that are not objects in the cluster (providers, Helm wrappers).
_NOT_MANIFESTS = (
    "kubernetes:helm.sh/",
    "kubernetes:kustomize/",
    "kubernetes:yaml/",
    "pulumi:providers:",
)

# libyaml's emitter where PyYAML was built with it: the same objects (it folds long quoted strings
# at other points) in a tenth of the time, and a plan writes a file per manifest.
SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def make_plan(
    stack: str, project_dir: Path = PROJECT_DIR, deployed_outputs: dict | None = None
) -> tuple[StackConfig, Plan]:
    """Validate the stack's config, then run the program offline, as an update of a stack whose
    outputs are `deployed_outputs` (none: a new stack). Raises ConfigError."""
    config = load_stack_file(stack, project_dir)
    values = read_stack_file(stack, project_dir)
    plan = run_offline(
        lambda: build_platform(config), stack, values, deployed_outputs=deployed_outputs
    )
    return config, plan


def kubernetes_manifests(plan: Plan) -> list[dict[str, Any]]:
    """Every Kubernetes object the program declares, as it would be applied."""
    manifests = []
    for resource in plan.resources:
        if not resource.type.startswith("kubernetes:") or resource.type.startswith(_NOT_MANIFESTS):
            continue
        manifest = {k: v for k, v in resource.inputs.items() if v is not None}
        metadata = dict(manifest.get("metadata") or {})
        metadata.setdefault("name", resource.name)
        manifest["metadata"] = metadata
        manifests.append(manifest)
    return manifests


def write_plan(plan: Plan, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    entries = [r.as_plan_entry() for r in plan.resources]
    (out / PLAN_FILE).write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    (out / OUTPUTS_FILE).write_text(json.dumps(plan.outputs, indent=2, sort_keys=True) + "\n")
    (out / STACK_FILE).write_text(json.dumps({"stack": plan.stack, "region": plan.region}) + "\n")
    manifest_dir = out / "manifests"
    shutil.rmtree(manifest_dir, ignore_errors=True)
    manifest_dir.mkdir()
    for manifest in kubernetes_manifests(plan):
        meta = manifest["metadata"]
        parts = [manifest.get("kind", "Object"), meta.get("namespace"), meta["name"]]
        filename = "_".join(p for p in parts if p).replace("/", "-") + ".yaml"
        (manifest_dir / filename).write_text(yaml.dump(manifest, Dumper=SafeDumper, sort_keys=True))


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """Rows of a plain-text table: numbers right-aligned, text left-aligned."""
    cells = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def cell(text: str, width: int) -> str:
        numeric = text.replace(",", "").replace(".", "").isdigit()
        return text.rjust(width) if numeric else text.ljust(width)

    return ["  " + "  ".join(cell(c, w) for c, w in zip(row, widths, strict=True)) for row in cells]


def cluster_queue_resources(plan: Plan, queue: str) -> dict[tuple[str, str], dict[str, str]]:
    """(flavor, resource) -> {nominalQuota, borrowingLimit?} of one ClusterQueue in the plan."""
    return {
        (dig(flavor, "name"), dig(res, "name")): res
        for r in plan.of_type("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue")
        if dig(r.inputs, "metadata", "name") == queue
        for group in listed(dig(r.inputs, "spec", "resourceGroups"))
        for flavor in listed(dig(group, "flavors"))
        for res in listed(dig(flavor, "resources"))
    }


def pool_rows(config: StackConfig, plan: Plan, cost: StackCost) -> list[str]:
    quota = cluster_queue_resources(plan, PLATFORM_QUEUE)

    def nominal(pool: str, resource: str) -> str:
        return quota.get((pool, resource), {}).get("nominalQuota", "-")

    # A static pool's line is always on (baseline), a dynamic one's a ceiling: both by pool name.
    priced = {line.item: line.usd_per_hour for line in cost.lines}
    rows = []
    for pool in config.node_pools:
        c = pool.ceiling()
        rows.append(
            [
                pool.name,
                ", ".join(pool.instance_types),
                c.nodes,
                c.gpus,
                c.vcpu,
                c.memory_gib,
                nominal(pool.name, "nvidia.com/gpu"),
                nominal(pool.name, "cpu"),
                nominal(pool.name, "memory"),
                money(priced[pool.name]) if pool.name in priced else "-",
            ]
        )
    ceilings = [p.ceiling() for p in config.node_pools]
    rows.append(
        [
            "total",
            "",
            sum(c.nodes for c in ceilings),
            sum(c.gpus for c in ceilings),
            sum(c.vcpu for c in ceilings),
            sum(c.memory_gib for c in ceilings),
            "",
            "",
            "",
            money(sum(priced.get(p.name, 0.0) for p in config.node_pools)),
        ]
    )
    header = ["pool", "instance types", "max nodes", "max GPUs", "max vCPU", "max mem GiB"]
    header += ["queue GPUs", "queue vCPU", "queue mem", "max $/hour"]
    lines = ["NodePools (ceilings: Karpenter limits; queue: platform ClusterQueue quota):"]
    return lines + table(header, rows)


def borrowing_rows(config: StackConfig, plan: Plan) -> list[str]:
    """Each borrowing team's limits per pool, in absolute units (what its percent amounts to)."""
    rows = []
    for team in config.queues.teams:
        if not team.own_cluster_queue:
            continue
        limits = cluster_queue_resources(plan, team_cluster_queue(team))
        for pool in config.node_pools:
            limit = [
                limits.get((pool.name, resource), {}).get("borrowingLimit", "-")
                for resource in ("nvidia.com/gpu", "cpu", "memory")
            ]
            share = f"{team.borrowing_limit_percent}%"
            rows.append([team.name, team_cluster_queue(team), share, pool.name, *limit])
    if not rows:
        return []
    header = ["team", "ClusterQueue", "share", "pool", "GPUs", "vCPU", "memory"]
    return ["", "Borrowing limits (team ClusterQueues, from unused platform quota):"] + table(
        header, rows
    )


def cold_start_rows(config: StackConfig) -> list[str]:
    """Each pool's cold start on its slowest type, and the Kueue timeouts derived from them."""
    starts = [cold_start(pool) for pool in config.node_pools]
    rows = [
        [
            s.pool,
            s.instance_type,
            s.disk,
            "yes" if s.fast_pull else "no",
            round(s.launch_s),
            round(s.pull_s),
            round(s.start_s),
            duration(s.total_s),
        ]
        for s in starts
    ]
    header = ["pool", "instance type", "image unpacks to", "parallel pull"]
    header += ["launch s", "pull s", "start s", "total"]
    timeouts = pods_ready_timeouts(config.node_pools)
    slowest = timeouts.slowest
    cold = f"{slowest.pool} {duration(slowest.total_s)}" if slowest else "no pool, at least"
    return [
        "",
        "Cold start of a pod on a new node (infra/karpenter/cold_start.py: launch to Ready + "
        "GPUs, image pull, process start):",
        *table(header, rows),
        f"  Kueue waitForPodsReady: timeout {duration(timeouts.timeout_s)} = slowest ({cold}) "
        f"x {MARGIN}; recoveryTimeout {duration(timeouts.recovery_timeout_s)} = "
        f"({duration(SPOT_NOTICE_S.value)} Spot notice + {cold}) x {MARGIN}",
        "  no blockAdmission (one starting pod never stalls admission); evicted workloads are "
        "requeued without limit",
    ]


def cost_rows(cost: StackCost, stack: list[Declared]) -> list[str]:
    """Floor, ceiling and expected figure; usage estimates; what is unpriced; every price's
    source (infra/core/cost.py, infra/jobs/expected.py, infra/jobs/usage.py)."""

    def row(item: str, detail: str, per_hour: float, per_month: float | None = None) -> list[str]:
        month = per_hour * HOURS_PER_MONTH if per_month is None else per_month
        return [item, detail, money(per_hour, 3), money(month, 0)]

    rows = [
        row(line.item, line.detail, line.usd_per_hour, line.usd_per_month) for line in cost.baseline
    ]
    rows.append(
        row(
            "floor",
            "always on, billed from pulumi up",
            cost.baseline_per_hour,
            cost.baseline_per_month,
        )
    )
    rows.append(row("NodePools", "dynamic pools at their ceilings", cost.pools_per_hour))
    rows += [row(line.item, line.detail, line.usd_per_hour) for line in cost.headroom + cost.quotas]
    rows.append(row("ceiling", "most this stack can cost", cost.total_per_hour))
    prices = cost.prices
    lines = [
        "",
        f"Cost (USD, list prices in {prices.region}; month = {HOURS_PER_MONTH} h):",
        *table(["item", "detail", "$/hour", "$/month"], rows),
        *[f"  not priced, so not included: {message}" for message in cost.unpriced],
        *[f"  unpriced type, not counted: {kind}" for kind in cost.unpriced_types],
    ]
    lines += expected_rows(expected_cost(cost, stack)) + system_rows(system_fit(stack))
    lines += usage_rows(usage_lines(cost, stack)) + price_source_rows(cost)
    return lines


def expected_rows(expected: Expected) -> list[str]:
    rows = []
    for run in expected.pools:
        if run.spot is not None and run.packed:
            rate = f"On-Demand (spot {money(run.spot, 4)} at best)"
        elif run.spot is not None:
            rate = f"{money(run.spot, 4)} spot"
        else:
            rate = "On-Demand" + (" (no spot figure)" if run.spot_allowed else "")
        rows.append(
            [
                run.pool,
                ", ".join(run.jobs),
                f"{run.nodes} of {run.asked}" if run.nodes < run.asked else run.nodes,
                run.billed,
                run.instance_type,
                rate,
                money(run.per_hour, 3),
                money(run.on_demand_per_hour, 3),
            ]
        )
    rows.append(["floor", "", "", "", "", "", money(expected.floor, 3), money(expected.floor, 3)])
    rows.append(
        [
            "expected",
            "declared jobs running",
            "",
            "",
            "",
            "",
            money(expected.per_hour, 3),
            money(expected.on_demand_per_hour, 3),
        ]
    )
    header = ["pool", "jobs", "nodes", "billed", "type", "node price", "$/hour", "On-Demand $/hour"]
    return [
        "",
        "Expected (the declared jobs running, one node per worker up to the pool's ceiling; idle "
        "pools empty; reserved and static nodes are in the floor):",
        *table(header, rows),
    ]


def system_rows(fit: SystemFit | None) -> list[str]:
    if fit is None:
        return []
    asked, room = fit.requested, fit.per_node * fit.desired
    verdict = (
        "fits"
        if fit.fits
        else f"DOES NOT FIT: needs desiredSize {fit.needed}"
        + (
            f"; too big for one node: {', '.join(p.name for p in fit.too_big)}"
            if fit.too_big
            else ""
        )
    )
    lines = [
        "",
        f"System nodes ({fit.desired} x {fit.instance_type}, desiredSize): controllers request "
        f"{asked.cpu:.2f} of {room.cpu:.2f} vCPU and {asked.memory_mib / 1024:.1f} of "
        f"{room.memory_mib / 1024:.1f} GiB left after the DaemonSets: {verdict}",
    ]
    if fit.stray:
        lines.append(
            "  refused by the system nodes, so they keep a pool node up (in the floor): "
            + ", ".join(p.name for p in fit.stray)
        )
    return lines


def usage_rows(usage: list[UsageLine]) -> list[str]:
    estimated = [u for u in usage if u.usd is not None]
    rows = [[u.item, u.formula, money(u.usd), u.per] for u in estimated]
    return [
        "",
        "Usage-priced, not in the hourly figures (estimates from the jobs' checkpoints and "
        "traffic; per run of a job, or per month):",
        *table(["item", "formula", "USD", "per"], rows),
        "  unit prices only: " + "; ".join(f"{u.item} {u.formula}" for u in usage if u.usd is None),
    ]


def price_source_rows(cost: StackCost) -> list[str]:
    prices = cost.prices
    by_source: dict[str, list[str]] = {}
    for key, price in sorted(cost.read.items()):
        by_source.setdefault(price.source, []).append(f"{key} {price.usd:g}")
    unverified = [f"{key} {p.usd:g}" for key, p in sorted(cost.read.items()) if p.unverified]
    return [
        "",
        "Prices and their sources:",
        f"  instances: {prices.instance_source}, as of {prices.instance_as_of}",
        f"  spot estimates: {prices.spot_source}",
        *[f"  {', '.join(keys)}: {source}" for source, keys in by_source.items()],
        f"  UNVERIFIED (no source confirmed them): {', '.join(unverified) or 'none'}",
    ]


def storage_rows(config: StackConfig) -> list[str]:
    storage = config.storage
    encryption = "SSE-KMS" if storage.bucket.kms else "SSE-S3"
    rows = [
        [
            "S3 bucket",
            f"{encryption}, versioned, checkpoints expire after "
            f"{storage.bucket.checkpoint_retention_days} days",
        ],
        ["EBS", "gp3 StorageClass (default, encrypted)"],
    ]
    if storage.efs.enabled:
        rows.append(["EFS", f"encrypted, elastic; claim {EFS_CLAIM} in every team namespace"])
    if storage.fsx.enabled:
        fsx = storage.fsx
        rows.append(
            [
                "FSx for Lustre",
                f"PERSISTENT_2 {fsx.storage_capacity_gib} GiB, "
                f"{fsx.throughput_per_tib} MB/s/TiB; claims {FSX_CHECKPOINTS_CLAIM} (the "
                f"team's own) and {FSX_DATASETS_CLAIM} (s3://<bucket>/{fsx.dataset_prefix}, "
                "read-only) in every team namespace",
            ]
        )
    return table(["store", "configuration"], rows)


def dev_server_rows(config: StackConfig) -> list[str]:
    section = config.dev_servers
    teams = {t.name: t for t in config.queues.teams}
    lines = table(
        ["flavor", "pool", "GPUs", "vCPU", "memory GiB"],
        [[f.name, f.node_pool, f.gpus, f.cpu, f.memory_gib] for f in section.flavors],
    )
    lines += [""] + table(
        ["user", "namespace", "ClusterQueue", "max servers", "max GPUs", "max home GiB"],
        [
            [
                u.name,
                user_namespace(u.name),
                team_cluster_queue(teams[u.team]),
                u.quota.servers,
                u.quota.gpus,
                u.quota.home_gib,
            ]
            for u in section.users
        ],
    )
    return lines


def release_moves(deployed: dict, planned: dict) -> list[str]:
    """What each pinned release that changes does to the running stack; a base from before the
    program exported its releases cannot say."""
    if VERSIONS_OUTPUT not in deployed:
        return [f"the base plan has no {VERSIONS_OUTPUT} output: pinned releases not compared"]
    return moves(deployed[VERSIONS_OUTPUT], planned[VERSIONS_OUTPUT])


def support_rows(config: StackConfig, cost: StackCost) -> list[str]:
    """The version's EKS support, what each upgrade policy does at its end, and the warning."""
    cluster = config.cluster
    known = KUBERNETES_VERSIONS[cluster.kubernetes_version]
    support = support_on(cluster.kubernetes_version, cluster.upgrade_policy)
    standard = cost.prices.service("eksStandardSupportPerHour").usd
    extended = cost.prices.service("eksExtendedSupportPerHour").usd
    extra = (extended - standard) * HOURS_PER_MONTH
    lines = [
        "",
        f"Kubernetes {cluster.kubernetes_version} on EKS: {support.detail}; at its end "
        f"({known.standard_support_ends}) upgradePolicy EXTENDED keeps it at ${extended:.2f}/h "
        f"instead of ${standard:.2f}/h (+${extra:,.0f}/month, until "
        f"{known.extended_support_ends}), "
        f"STANDARD has EKS upgrade it; this stack: {cluster.upgrade_policy}",
    ]
    if support.warning:
        lines.append(f"  WARNING: {support.warning}")
    return lines


def summary(config: StackConfig, plan: Plan, resource_counts: bool = False) -> str:
    """NodePools and cost first; then storage, jobs, teams; resource counts only when asked."""
    cost = plan_cost(config.region, plan)
    lines = [f"Stack {plan.stack} ({config.region}): {len(plan.resources)} resources", ""]
    if config.node_pools:
        lines += pool_rows(config, plan, cost) + borrowing_rows(config, plan)
        lines += cold_start_rows(config)
    lines += cost_rows(cost, declared_in(plan))
    lines += support_rows(config, cost)
    placeholders = placeholder_errors(config)
    if placeholders:
        lines += ["", "Placeholders (pulumi preview/up refuse them until replaced):"]
        lines += [f"  {line}" for line in placeholders]
    lines += ["", "Storage:"] + storage_rows(config)
    if config.jobs:
        # Per node: the pod asks for all of the node's GPUs.
        gpus = {job.name: config.job_pool(job).gpus_per_node for job in config.jobs}
        images = plan.outputs.get("trainerImages") or {"all": config.image.uri}
        lines += ["", "Jobs (start, and bill, on pulumi up):"]
        lines += table(
            ["job", "kind", "pool", "nodes", "GPUs", "queue", "checkpoint"],
            [
                [
                    j.name,
                    j.kind,
                    j.node_pool,
                    f"{j.min_nodes}-{j.max_nodes}",
                    f"{gpus[j.name] * j.min_nodes}-{gpus[j.name] * j.max_nodes}",
                    j.queue,
                    j.checkpoint,
                ]
                for j in config.jobs
            ],
        )
        lines += [f"  image ({target}): {ref}" for target, ref in sorted(images.items())]
        code_images = plan.outputs.get("codeImages") or {}
        lines += [
            f"  {j.name} runs {runs(j)}"
            + (f", built into {code_images[j.name]}" if j.name in code_images else "")
            for j in config.jobs
        ]
        lines += [
            f"  WARNING: {pytorchjob_warning(j.name, j.min_nodes < j.max_nodes)}"
            for j in config.jobs
            if j.kind == "PyTorchJob"
        ]
    if config.queues.teams:
        lines += ["", "Teams (Kueue):"]
        lines += table(
            [
                "team",
                "namespace",
                "LocalQueue",
                "ClusterQueue",
                "borrowing limit",
                "members",
                "TensorBoard",
            ],
            [
                [
                    t.name,
                    t.namespace_name,
                    t.name,
                    team_cluster_queue(t),
                    f"{t.borrowing_limit_percent}%" if t.own_cluster_queue else "-",
                    str(len(t.members)),
                    "yes" if t.tensorboard else "no",
                ]
                for t in config.queues.teams
            ],
        )
        repositories = plan.outputs.get("teamImageRepositories") or {}
        lines += [
            f"  {team} members push their images to {url} (devctl submit --image)"
            for team, url in sorted(repositories.items())
        ]
    if config.dev_servers.enabled:
        lines += ["", "DevServers:"] + dev_server_rows(config)
    if resource_counts:
        counts = Counter(r.type for r in plan.resources)
        lines += ["", "Resources by type:"] + table(["type", "count"], sorted(counts.items()))
    return "\n".join(lines)


@dataclass
class Base:
    """What the plan is compared with: a plan of the stack as deployed (or as it was)."""

    name: str
    plan: Plan | None
    facts: Facts | None

    @property
    def outputs(self) -> dict | None:
        return self.plan.outputs if self.plan else None


def read_plan(folder: Path, stack: str) -> Plan | None:
    """The plan written to `folder`, or None where there is none."""
    entries = folder / PLAN_FILE
    if not entries.is_file():
        return None
    outputs, meta = folder / OUTPUTS_FILE, folder / STACK_FILE
    return Plan(
        stack=stack,
        resources=[RecordedResource.from_plan_entry(e) for e in json.loads(entries.read_text())],
        outputs=json.loads(outputs.read_text()) if outputs.is_file() else {},
        region=json.loads(meta.read_text())["region"] if meta.is_file() else "",
    )


def read_base(folder: Path, stack: str) -> Base:
    facts = folder / FACTS_FILE
    return Base(
        f"the plan in {folder}",
        read_plan(folder, stack),
        json.loads(facts.read_text()) if facts.is_file() else None,
    )


def tree_at(ref: str, project_dir: Path, into: Path) -> None:
    """The files of `ref` in `into`, as a checkout would write them. Their modes are part of every
    image's tag (infra/images/container_image.py source_tag), and `git archive` writes 0664 unless
    told the umask (git-config tar.umask, default 0002): with it, a ref that is the checkout's
    own HEAD plans the same images as the checkout."""
    into.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(project_dir), "-c", "tar.umask=user", "archive", ref, "./"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


def base_at_ref(stack: str, ref: str, project_dir: Path) -> Base:
    """The stack as git `ref` would deploy it: its code and its stack file, planned in a copy of
    the ref's tree. Where the ref has no plan command (the project folder holds only stack files,
    or the ref predates it), its stack file planned by this checkout's code. A stack file the ref
    lacks (a new stack) has no base: everything is new."""

    def git(*args: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(project_dir), *args], capture_output=True, **kwargs)

    if git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode != 0:
        raise ConfigError(f"--against-ref: {ref!r} is not a commit in {project_dir}")
    name = f"Pulumi.{stack}.yaml at {ref}"
    shown = git("show", f"{ref}:./Pulumi.{stack}.yaml", text=True)
    if shown.returncode != 0:
        return Base(name, None, {})
    with tempfile.TemporaryDirectory() as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "plan"
        if git("cat-file", "-e", f"{ref}:./deploy/plan.py").returncode == 0:
            tree_at(ref, project_dir, tree)
            ran = subprocess.run(
                [sys.executable, "-m", "deploy.plan", "--stack", stack, "--out", str(out)],
                cwd=tree,
                capture_output=True,
                text=True,
            )
            if ran.returncode == 2 or not (out / PLAN_FILE).is_file():
                raise ConfigError(f"{name} does not plan with its own code: {ran.stderr.strip()}")
            planned = read_base(out, stack)
            return Base(f"{name} (its code and stack file)", planned.plan, planned.facts)
        (Path(tmp) / f"Pulumi.{stack}.yaml").write_text(shown.stdout)
        try:
            config, plan = make_plan(stack, Path(tmp))
        except ConfigError as e:
            raise ConfigError(f"{name} does not plan: {e}") from None
        return Base(f"{name} (planned by this checkout's code)", plan, plan_facts(config, plan))


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.plan", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    parser.add_argument(
        "--out", type=Path, help="output folder (default: build/plan/<stack>, what make plan uses)"
    )
    parser.add_argument(
        "--project-dir",
        type=Path,
        help="folder holding the Pulumi.<stack>.yaml files (default: this checkout)",
    )
    against = parser.add_mutually_exclusive_group()
    against.add_argument(
        "--against",
        type=Path,
        metavar="DIR",
        help="compare with the plan written to DIR (default: the last plan that passed in --out)",
    )
    against.add_argument(
        "--against-ref",
        metavar="GITREF",
        help="compare with the stack as git ref GITREF would deploy it, its code and stack file "
        "(e.g. origin/main; default: the last plan that passed in --out)",
    )
    parser.add_argument(
        "--resources", action="store_true", help="also count the resources by type (default: off)"
    )
    parser.add_argument(
        "--as-of",
        metavar="YYYY-MM-DD",
        help="price and warn as on that day, e.g. after the cluster's Kubernetes version leaves "
        f"standard support (default: today, UTC; also {PLAN_DAY_VARIABLE})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.as_of:
        os.environ[PLAN_DAY_VARIABLE] = args.as_of
    project_dir = args.project_dir or PROJECT_DIR
    out = args.out or Path("build/plan") / args.stack
    try:
        plan_day()  # a bad --as-of is a config error before anything is planned
        if args.against_ref:
            base = base_at_ref(args.stack, args.against_ref, project_dir)
        else:
            base = read_base(args.against or out / BASE_DIR, args.stack)
        config, plan = make_plan(args.stack, project_dir, base.outputs)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    new = plan_facts(config, plan)
    if base.facts is None:
        changed = [f"no earlier plan in {args.against or out / BASE_DIR} to compare with"]
    else:
        changed = changes(base.facts, new) or ["no change"]
    effects = None
    if base.plan:
        steps = plan_steps(base.plan, plan)
        effects = consequences(
            steps, config, args.stack, plan.outputs.get("jobs"), plan.outputs.get("runtimes")
        )
        effects.notes += release_moves(base.plan.outputs, plan.outputs)
        rise = ceiling_rise(
            plan_cost(config.region, base.plan).total_per_hour,
            plan_cost(config.region, plan).total_per_hour,
            "budget_usd_per_hour" in config.policy.model_fields_set,
        )
        effects.refusals += [rise] if rise else []
    write_plan(plan, out)
    (out / FACTS_FILE).write_text(json.dumps(new, indent=2) + "\n")
    (out / CHANGES_FILE).write_text("\n".join(changed) + "\n")
    print(summary(config, plan, resource_counts=args.resources))
    print(f"\nChanges against {base.name}:" if base.facts is not None else "\nChanges:")
    print("\n".join(f"  {line}" for line in changed))
    if effects is not None:
        print(f"\nWhat this change does to what exists (against {base.name}):")
        print("\n".join(effects.lines()))
    print(f"\nWrote {out / PLAN_FILE}, {out / CHANGES_FILE} and {out / 'manifests'}/")
    violations = check(plan, policy_settings(config))
    refusals = effects.refusals if effects else []
    print(f"\nPolicies: {len(violations) + len(refusals)} violations")
    for refusal in refusals:
        print(f"  [mandatory] {refusal}")
    for violation in violations:
        print(f"  {violation}")
    mandatory = refusals or any(v.enforcement == "mandatory" for v in violations)
    if not mandatory:
        (out / BASE_DIR).mkdir(exist_ok=True)
        for name in (PLAN_FILE, OUTPUTS_FILE, STACK_FILE, FACTS_FILE):
            shutil.copy(out / name, out / BASE_DIR / name)
    return 1 if mandatory else 0


if __name__ == "__main__":
    sys.exit(main())
