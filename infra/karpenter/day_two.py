"""Which nodes a change drifts. Karpenter v1.14.1 drifts a node when its NodePool's
`spec.template` changes (its hash covers everything there but `requirements`:
kubernetes-sigs/karpenter pkg/apis/v1/nodepool.go Hash), when a requirement no longer admits the
node (pkg/controllers/nodeclaim/disruption/drift.go areRequirementsDrifted), when its
EC2NodeClass's spec changes outside the selector terms (karpenter-provider-aws
pkg/apis/v1/ec2nodeclass.go Hash), or when the AMI its alias resolves to changes: the alias's SSM
path names the cluster's Kubernetes version (pkg/providers/amifamily/al2023.go resolvePath), so
an upgrade drifts every node."""

from infra.core.change import DELETE, REPLACE, UPDATE, Step
from infra.core.day_two import Change
from infra.core.declared import dig, listed
from infra.core.replacement import changed_paths
from infra.eks.day_two import version_changes
from infra.karpenter.facts import NODECLASS, NODEPOOL

# What EC2NodeClass drift leaves out of its hash: resolved dynamically, drifting only the nodes
# whose subnet, security groups, reservation or AMI no longer match (ec2nodeclass.go hash:"ignore").
NODECLASS_DYNAMIC = {
    "subnetSelectorTerms",
    "securityGroupSelectorTerms",
    "capacityReservationSelectorTerms",
    "amiSelectorTerms",
    "amiFamily",
    "ipPrefixCount",
}


def _pool_nodes(step: Step) -> str:
    nodes = dig((step.new or step.old).inputs, "spec", "limits", "nodes")
    return f"up to {nodes} nodes" if nodes else "its nodes"


def drift(change: Change) -> None:
    """Pools whose nodes drift, with a line each."""
    steps = change.steps
    drifted: dict[str, str] = {}
    pools = {
        dig((s.new or s.old).inputs, "metadata", "name"): s for s in steps if s.type == NODEPOOL
    }
    for old, new in sorted(version_changes(steps))[:1]:
        for pool, max_nodes in change.pools.items():
            drifted[pool] = (
                f"{pool}: every node (AMI for Kubernetes {old} -> {new}); up to {max_nodes} nodes"
            )
    for step in steps:
        name = dig((step.new or step.old).inputs, "metadata", "name")
        if step.type == NODEPOOL:
            why = _nodepool_drift(step)
            if why and name not in drifted:
                drifted[name] = f"{name}: {why}; {_pool_nodes(step)}"
        elif step.type == NODECLASS and step.op == UPDATE:
            changed = {p.split(".")[1].split("[")[0] for p in step.reasons if p.startswith("spec.")}
            static = sorted(changed - NODECLASS_DYNAMIC)
            ami = "amiSelectorTerms" in changed
            if (static or ami) and name not in drifted:
                cause = f"EC2NodeClass {', '.join(static)}" if static else "a new AMI"
                pool = pools.get(name)
                nodes = _pool_nodes(pool) if pool else "its nodes"
                drifted[name] = f"{name}: every node ({cause}); {nodes}"
            left = _reservations(step.old) - _reservations(step.new)
            if left and name not in drifted:
                drifted[name] = (
                    f"{name}: the nodes in capacity reservation {', '.join(sorted(left))} (no "
                    "longer selected: karpenter-provider-aws pkg/cloudprovider/drift.go "
                    "isCapacityReservationDrifted)"
                )
    change.found.drifts += [drifted[name] for name in sorted(drifted)]
    change.drifted |= set(drifted)


def _reservations(nodeclass) -> set[str]:
    """The capacity reservations an EC2NodeClass selects, each as its selector term reads."""
    terms = listed(dig(nodeclass.inputs, "spec", "capacityReservationSelectorTerms"))
    return {
        term.get("id")
        or "tagged " + " ".join(f"{k}={v}" for k, v in sorted((term.get("tags") or {}).items()))
        for term in terms
    }


def _nodepool_drift(step: Step) -> str | None:
    if step.op == DELETE:
        # pulumi-kubernetes deletes in the foreground and waits up to its delete timeout (10
        # minutes by default: pulumi-kubernetes provider/pkg/await) while Karpenter's
        # finalizer keeps the NodePool until its nodes are gone, and do-not-disrupt pods keep
        # their nodes until they end.
        return (
            "deleted: Karpenter drains every node, but a node with a running job or DevServer "
            "(do-not-disrupt) stays until it ends, and `pulumi up` fails after waiting 10 "
            "minutes for the NodePool; drain it first (docs/platform/day-two.md, deleting a pool)"
        )
    if step.op == REPLACE:
        return "replaced: every node is drained and launched again"
    if step.op != UPDATE:
        return None
    old = dig(step.old.inputs, "spec", "template") or {}
    new = dig(step.new.inputs, "spec", "template") or {}
    hashed = [p for p in changed_paths(old, new) if not p.startswith("spec.requirements")]
    if hashed:
        fields = sorted({".".join(p.split(".")[:2]).split("[")[0] for p in hashed})
        return f"every node (template {', '.join(fields)})"
    removed = []
    before = _requirements(old)
    after = _requirements(new)
    for key, values in before.items():
        gone = sorted(values - after.get(key, values))
        if gone:
            removed.append(f"{key} {', '.join(gone)}")
    if set(after) - set(before):
        return f"every node (new requirement on {', '.join(sorted(set(after) - set(before)))})"
    if removed:
        return f"the nodes with {'; '.join(removed)} (no longer allowed)"
    return None


def _requirements(template: dict) -> dict[str, set[str]]:
    return {
        dig(r, "key"): set(map(str, listed(dig(r, "values"))))
        for r in listed(dig(template, "spec", "requirements"))
        if dig(r, "operator") == "In"
    }
