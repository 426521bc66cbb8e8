"""What changes between two plans of a stack, in the terms that matter: limits, quotas, sizes, cost.

A plan's facts are `{subject: {field: value}}` (e.g. `"NodePool gpu-small": {"limits.nodes": "4"}`),
written beside plan.json as facts.json; the change list compares two of them line by line:

    NodePool gpu-small limits.nodes 4 -> 12
"""

from typing import Any

from infra.core.bill import money
from infra.core.catalog import load_prices
from infra.core.declared import declared_in, dig, listed
from infra.core.offline import Plan
from infra.integrations import stack_cost
from infra.jobs.expected import expected_cost
from infra.karpenter.facts import INSTANCE_TYPE_LABEL, NODEPOOL
from infra.stack.config import StackConfig

Facts = dict[str, dict[str, str]]
ABSENT = "-"
# Fields a program edit may drop are left out of the facts, so the change list shows them `-`.
REQUIREMENT_FACTS = {
    INSTANCE_TYPE_LABEL: "instance-types",
    "karpenter.sh/capacity-type": "capacity-types",
}


def _present(fields: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in fields.items() if v is not None}


def plan_facts(config: StackConfig, plan: Plan) -> Facts:
    facts: Facts = {}
    for pool in plan.of_type(NODEPOOL):
        spec = dig(pool.inputs, "spec")
        limits = dig(spec, "limits") or {}
        requirements = {
            dig(r, "key"): ",".join(map(str, listed(dig(r, "values"))))
            for r in listed(dig(spec, "template", "spec", "requirements"))
        }
        facts[f"NodePool {dig(pool.inputs, 'metadata', 'name') or pool.name}"] = {
            **{f"limits.{k}": str(v) for k, v in sorted(limits.items())},
            **_present({field: requirements.get(key) for key, field in REQUIREMENT_FACTS.items()}),
        }
    for queue in plan.of_type("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"):
        fields = {}
        for group in listed(dig(queue.inputs, "spec", "resourceGroups")):
            for flavor in listed(dig(group, "flavors")):
                for res in listed(dig(flavor, "resources")):
                    key = f"{dig(flavor, 'name')}.{dig(res, 'name')}"
                    fields[f"quota.{key}"] = dig(res, "nominalQuota")
                    fields[f"borrowing.{key}"] = dig(res, "borrowingLimit")
        name = dig(queue.inputs, "metadata", "name") or queue.name
        facts[f"ClusterQueue {name}"] = _present(fields)
    for group in plan.of_type("aws:eks/nodeGroup:NodeGroup"):
        scaling = dig(group.inputs, "scalingConfig") or {}
        facts[f"NodeGroup {group.name}"] = {
            "instance-types": ",".join(map(str, listed(dig(group.inputs, "instanceTypes")))),
            **{f"scaling.{k}": str(v) for k, v in sorted(scaling.items())},
        }
    facts["Network"] = {"nat-gateways": str(len(plan.of_type("aws:ec2/natGateway:NatGateway")))}
    for fsx in plan.of_type("aws:fsx/lustreFileSystem:LustreFileSystem"):
        facts[f"FSx {fsx.name}"] = _present(
            {
                "storage-gib": dig(fsx.inputs, "storageCapacity"),
                "throughput-per-tib": dig(fsx.inputs, "perUnitStorageThroughput"),
            }
        )
    for job in config.jobs:
        facts[f"Job {job.name}"] = {
            "kind": job.kind,
            "pool": job.node_pool,
            "nodes": f"{job.min_nodes}-{job.max_nodes}",
            "queue": job.queue,
        }
    stack = declared_in(plan)
    cost = stack_cost(load_prices(config.region), stack)
    for line in cost.pools:
        facts.setdefault(f"NodePool {line.item}", {})["max $/hour"] = money(line.usd_per_hour)
    # Three decimals, as the summary's cost table: a NAT gateway hour is $0.045.
    facts["Cost"] = {
        "region": cost.prices.region,
        **{
            f"{line.item} $/hour": money(line.usd_per_hour, 3)
            for line in cost.baseline + cost.headroom + cost.quotas
        },
        **{f"unpriced {i + 1}": message for i, message in enumerate(cost.unpriced)},
        **{f"unpriced type {i + 1}": kind for i, kind in enumerate(cost.unpriced_types)},
        "floor $/hour": money(cost.baseline_per_hour, 3),
        "expected $/hour": money(expected_cost(cost, stack).per_hour, 3),
        "NodePools max $/hour": money(cost.pools_per_hour, 3),
        "ceiling $/hour": money(cost.total_per_hour, 3),
    }
    return facts


def changes(old: Facts, new: Facts) -> list[str]:
    """`<subject> <field> <old> -> <new>` per differing field, `-` where a side has none."""
    lines = []
    for subject in sorted(old.keys() | new.keys(), key=_subject_order):
        before, after = old.get(subject, {}), new.get(subject, {})
        for field in [*before, *(f for f in after if f not in before)]:
            a, b = before.get(field, ABSENT), after.get(field, ABSENT)
            if a != b:
                lines.append(f"{subject} {field} {a} -> {b}")
    return lines


_ORDER = ["NodePool", "ClusterQueue", "NodeGroup", "Network", "FSx", "Job", "Cost"]


def _subject_order(subject: str) -> tuple[Any, ...]:
    kind = subject.split(" ", 1)[0]
    return (_ORDER.index(kind) if kind in _ORDER else len(_ORDER), subject)
