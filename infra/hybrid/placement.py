"""Where a pod on a pool goes: its node selector, node affinity and tolerations, one rule for job
pod templates (workloads/manifests.py) and DevServer flavors (devservers/component.py), NodePools
and hybrid machines.

A pod selects its nodes by labels no kubelet can set on its own Node (POOL_LABEL, MACHINE_LABEL:
node_pools.py says why), so a node that joins cannot pass for a pool or for another machine, and
tolerates exactly the taints its pool's nodes carry. On the hybrid machines a pool is the
machines a job's team or a flavor may use (infra/config HybridPool): its pods select those
machines and tolerate their taints, and no other. The machines' Kueue flavor injects no
toleration (hybrid_nodes.kueue_flavor says why).
"""

from infra.core.nodes import GPU_TAINT, MACHINE_LABEL, POOL_LABEL
from infra.core.pools import Pool
from infra.hybrid.machines import HYBRID_TAINT, machine_taint


def node_taints(pool: Pool) -> list[dict]:
    """GPU pools' nodes carry GPU_TAINT (node_pools.py); each hybrid machine HYBRID_TAINT and its
    own machine taint, GPUs or not (hybrid_machines.node_taints)."""
    if pool.hybrid:
        return [HYBRID_TAINT, *(machine_taint(m.name) for m in pool.machines)]
    return [GPU_TAINT] if pool.gpu else []


def node_selector(pool: Pool) -> dict[str, str]:
    """The pool's label; a hybrid pool of one machine adds that machine's."""
    selector = {POOL_LABEL: pool.name}
    if pool.hybrid and len(pool.machines) == 1:
        selector[MACHINE_LABEL] = pool.machines[0].name
    return selector


def node_affinity(pool: Pool) -> dict | None:
    """A hybrid pool of several machines: a node of one of them (a selector names only one)."""
    if not pool.hybrid or len(pool.machines) < 2:
        return None
    names = [m.name for m in pool.machines]
    term = {"matchExpressions": [{"key": MACHINE_LABEL, "operator": "In", "values": names}]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def tolerations(pool: Pool) -> list[dict]:
    return [{**taint, "operator": "Equal"} for taint in node_taints(pool)]


def pod_placement(pool: Pool) -> dict:
    """A pod spec's nodeSelector, affinity and tolerations for `pool`, those it needs."""
    placement = {
        "nodeSelector": node_selector(pool),
        "affinity": node_affinity(pool),
        "tolerations": tolerations(pool),
    }
    return {key: value for key, value in placement.items() if value}
