"""What changes between two plans of a stack, in the terms that matter: limits, quotas, sizes, cost.

A plan's facts are `{subject: {field: value}}` (e.g. `"NodePool gpu-small": {"limits.nodes": "4"}`),
written beside plan.json as facts.json; the change list compares two of them line by line:

    NodePool gpu-small limits.nodes 4 -> 12
"""

from typing import Any

from infra.config import StackConfig
from infra.cost import stack_cost
from infra.offline import Plan

Facts = dict[str, dict[str, str]]
ABSENT = "-"


def _money(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}"


def plan_facts(config: StackConfig, plan: Plan) -> Facts:
    facts: Facts = {}
    for pool in plan.of_type("kubernetes:karpenter.sh/v1:NodePool"):
        spec = pool.inputs["spec"]
        requirements = {r["key"]: r["values"] for r in spec["template"]["spec"]["requirements"]}
        facts[f"NodePool {pool.inputs['metadata']['name']}"] = {
            **{f"limits.{k}": str(v) for k, v in sorted(spec["limits"].items())},
            "instance-types": ",".join(requirements["node.kubernetes.io/instance-type"]),
            "capacity-types": ",".join(requirements["karpenter.sh/capacity-type"]),
        }
    for queue in plan.of_type("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"):
        fields = {}
        for group in queue.inputs["spec"]["resourceGroups"]:
            for flavor in group["flavors"]:
                for res in flavor["resources"]:
                    key = f"{flavor['name']}.{res['name']}"
                    fields[f"quota.{key}"] = str(res["nominalQuota"])
                    if "borrowingLimit" in res:
                        fields[f"borrowing.{key}"] = str(res["borrowingLimit"])
        facts[f"ClusterQueue {queue.inputs['metadata']['name']}"] = fields
    for group in plan.of_type("aws:eks/nodeGroup:NodeGroup"):
        scaling = group.inputs["scalingConfig"]
        facts[f"NodeGroup {group.name}"] = {
            "instance-types": ",".join(group.inputs["instanceTypes"]),
            **{f"scaling.{k}": str(v) for k, v in sorted(scaling.items())},
        }
    facts["Network"] = {"nat-gateways": str(len(plan.of_type("aws:ec2/natGateway:NatGateway")))}
    for fsx in plan.of_type("aws:fsx/lustreFileSystem:LustreFileSystem"):
        facts[f"FSx {fsx.name}"] = {
            "storage-gib": str(fsx.inputs["storageCapacity"]),
            "throughput-per-tib": str(fsx.inputs["perUnitStorageThroughput"]),
        }
    for job in config.jobs:
        facts[f"Job {job.name}"] = {
            "kind": job.kind,
            "pool": job.node_pool,
            "nodes": f"{job.min_nodes}-{job.max_nodes}",
            "queue": job.queue,
        }
    cost = stack_cost(config, plan)
    for line in cost.pools:
        facts[f"NodePool {line.item}"]["max $/hour"] = _money(line.usd_per_hour)
    # Three decimals, as the summary's cost table: a NAT gateway hour is $0.045.
    facts["Cost"] = {
        "region": cost.prices.region,
        **{f"{line.item} $/hour": _money(line.usd_per_hour, 3) for line in cost.baseline},
        "baseline $/hour": _money(cost.baseline_per_hour, 3),
        "NodePools max $/hour": _money(cost.pools_per_hour, 3),
        "total max $/hour": _money(cost.total_per_hour, 3),
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
