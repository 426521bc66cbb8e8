"""Offline plan, the `cdk synth` Pulumi lacks: run the program under mocks, write what it declares.

    python -m infra.plan --stack dev --out build/plan/dev

writes `plan.json` (one object per registered resource) and `manifests/` (one YAML file per
Kubernetes object), then prints a summary. Invalid stack config exits 2 with the config message.
"""

import argparse
import json
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from infra.catalog import load_catalog, load_storage_prices
from infra.components.lustre import CLAIM as FSX_CLAIM
from infra.components.queues import PLATFORM_QUEUE, team_cluster_queue
from infra.components.shared_file_system import CLAIM as EFS_CLAIM
from infra.config import ConfigError, StackConfig, load_stack_file, read_stack_file
from infra.offline import Plan, run_offline
from infra.paths import PROJECT_DIR
from infra.program import build_platform
from policies.offline import check

# Kubernetes types that are not objects in the cluster (providers, Helm wrappers).
_NOT_MANIFESTS = (
    "kubernetes:helm.sh/",
    "kubernetes:kustomize/",
    "kubernetes:yaml/",
    "pulumi:providers:",
)


def make_plan(stack: str, project_dir: Path = PROJECT_DIR) -> tuple[StackConfig, Plan]:
    """Validate the stack's config, then run the program offline. Raises ConfigError."""
    config = load_stack_file(stack, project_dir)
    plan = run_offline(lambda: build_platform(config), stack, read_stack_file(stack, project_dir))
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
    (out / "plan.json").write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    manifest_dir = out / "manifests"
    shutil.rmtree(manifest_dir, ignore_errors=True)
    manifest_dir.mkdir()
    for manifest in kubernetes_manifests(plan):
        meta = manifest["metadata"]
        parts = [manifest.get("kind", "Object"), meta.get("namespace"), meta["name"]]
        filename = "_".join(p for p in parts if p).replace("/", "-") + ".yaml"
        (manifest_dir / filename).write_text(yaml.safe_dump(manifest, sort_keys=True))


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """Rows of a plain-text table: numbers right-aligned, text left-aligned."""
    cells = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def cell(text: str, width: int) -> str:
        numeric = text.replace(",", "").replace(".", "").isdigit()
        return text.rjust(width) if numeric else text.ljust(width)

    return ["  " + "  ".join(cell(c, w) for c, w in zip(row, widths, strict=True)) for row in cells]


def platform_quota(plan: Plan) -> dict[tuple[str, str], str]:
    """(flavor, resource) -> nominal quota of the platform ClusterQueue, as the plan declares it."""
    queues = [
        r
        for r in plan.of_type("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue")
        if r.inputs["metadata"]["name"] == PLATFORM_QUEUE
    ]
    return {
        (flavor["name"], res["name"]): res["nominalQuota"]
        for queue in queues
        for group in queue.inputs["spec"]["resourceGroups"]
        for flavor in group["flavors"]
        for res in flavor["resources"]
    }


def storage_rows(config: StackConfig) -> list[str]:
    storage, prices = config.storage, load_storage_prices()
    encryption = "SSE-KMS" if storage.bucket.kms else "SSE-S3"
    rows = [
        [
            "S3 bucket",
            f"{encryption}, versioned, checkpoints expire after "
            f"{storage.bucket.checkpoint_retention_days} days",
            "per GiB stored",
        ],
        ["EBS", "gp3 StorageClass (default, encrypted)", "per volume"],
    ]
    if storage.efs.enabled:
        rows.append(
            [
                "EFS",
                f"encrypted, elastic; claim {EFS_CLAIM} in every team namespace",
                "per GiB used",
            ]
        )
    if storage.fsx.enabled:
        fsx = storage.fsx
        monthly = fsx.storage_capacity_gib * prices.fsx_per_gib_month[fsx.throughput_per_tib]
        rows.append(
            [
                "FSx for Lustre",
                f"PERSISTENT_2 {fsx.storage_capacity_gib} GiB, "
                f"{fsx.throughput_per_tib} MB/s/TiB, s3://<bucket>/{fsx.dataset_prefix}; "
                f"claim {FSX_CLAIM}",
                f"${monthly:,.2f}/month",
            ]
        )
    lines = table(["store", "configuration", "cost"], rows)
    if storage.fsx.enabled:
        lines.append(f"  prices: {prices.price_source}, as of {prices.price_as_of}")
    return lines


def summary(config: StackConfig, plan: Plan) -> str:
    counts = Counter(r.type for r in plan.resources)
    lines = [f"Stack {plan.stack}: {len(plan.resources)} resources", ""]
    lines += table(["resource type", "count"], sorted(counts.items()))
    if config.node_pools:
        ceilings = [(p, p.ceiling()) for p in config.node_pools]
        quota = platform_quota(plan)
        rows = [
            [
                p.name,
                ", ".join(p.instance_types),
                c.nodes,
                c.gpus,
                c.vcpu,
                quota.get((p.name, "nvidia.com/gpu"), "-"),
                quota.get((p.name, "cpu"), "-"),
                f"{c.usd_per_hour:,.2f}",
            ]
            for p, c in ceilings
        ]
        rows.append(
            [
                "total",
                "",
                sum(c.nodes for _, c in ceilings),
                sum(c.gpus for _, c in ceilings),
                sum(c.vcpu for _, c in ceilings),
                "",
                "",
                f"{sum(c.usd_per_hour for _, c in ceilings):,.2f}",
            ]
        )
        catalog = load_catalog()
        lines += ["", "NodePools (ceilings; cost at on-demand prices):"]
        lines += table(
            [
                "pool",
                "instance types",
                "max nodes",
                "max GPUs",
                "max vCPU",
                "queue GPUs",
                "queue vCPU",
                "max $/hour",
            ],
            rows,
        )
        lines.append(f"  prices: {catalog.price_source}, as of {catalog.price_as_of}")
        lines.append("  queue: nominal quota of the platform ClusterQueue, per pool's flavor")
    lines += ["", "Storage:"] + storage_rows(config)
    if config.jobs:
        pools = {p.name: p for p in config.node_pools}

        def gpus(job):  # per node: the pod asks for all of the node's GPUs
            return pools[job.node_pool].gpus_per_node

        images = plan.outputs.get("trainerImages") or {"all": config.image.uri}
        lines += ["", "Jobs:"]
        lines += table(
            ["job", "kind", "pool", "nodes", "GPUs", "queue", "checkpoint"],
            [
                [
                    j.name,
                    j.kind,
                    j.node_pool,
                    f"{j.min_nodes}-{j.max_nodes}",
                    f"{gpus(j) * j.min_nodes}-{gpus(j) * j.max_nodes}",
                    j.queue,
                    j.checkpoint,
                ]
                for j in config.jobs
            ],
        )
        lines += [f"  image ({target}): {ref}" for target, ref in sorted(images.items())]
    if config.queues.teams:
        lines += ["", "Teams (Kueue):"]
        lines += table(
            ["team", "namespace", "LocalQueue", "ClusterQueue", "borrowing limit"],
            [
                [
                    t.name,
                    t.namespace_name,
                    t.name,
                    team_cluster_queue(t),
                    f"{t.borrowing_limit_percent}%" if t.own_cluster_queue else "-",
                ]
                for t in config.queues.teams
            ],
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.plan", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    parser.add_argument("--out", type=Path, help="output folder (default build/plan/<stack>)")
    parser.add_argument(
        "--project-dir",
        type=Path,
        default=PROJECT_DIR,
        help="folder holding the Pulumi.<stack>.yaml files",
    )
    args = parser.parse_args(argv)
    out = args.out or Path("build/plan") / args.stack
    try:
        config, plan = make_plan(args.stack, args.project_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_plan(plan, out)
    print(summary(config, plan))
    print(f"\nWrote {out / 'plan.json'} and {out / 'manifests'}/")
    violations = check(plan, config.policy.model_dump(by_alias=True))
    print(f"\nPolicies: {len(violations)} violations")
    for violation in violations:
        print(f"  {violation}")
    return 1 if any(v.enforcement == "mandatory" for v in violations) else 0


if __name__ == "__main__":
    sys.exit(main())
