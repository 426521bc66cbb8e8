"""Where a pod on a pool goes: its node selector and tolerations, one rule for job pod templates
(workloads/manifests.py) and DevServer flavors (devservers/component.py), NodePools and hybrid
machines.

A pod tolerates exactly the taints its pool's nodes carry. The hybrid machines' Kueue flavor
injects no toleration (hybrid_nodes.kueue_flavor says why), so a pod reaches them only with the
toleration written here, for a job or flavor that names `nodePool: hybrid`.
"""

from infra.components.hybrid_machines import HYBRID_TAINT
from infra.components.node_pools import GPU_TAINT, POOL_LABEL
from infra.config import Pool


def node_taints(pool: Pool) -> list[dict]:
    """GPU pools' nodes carry GPU_TAINT (node_pools.py); hybrid machines carry HYBRID_TAINT and
    nothing else, GPUs or not (hybrid_machines.node_config)."""
    if pool.hybrid:
        return [HYBRID_TAINT]
    return [GPU_TAINT] if pool.gpu else []


def node_selector(pool: Pool) -> dict[str, str]:
    return {POOL_LABEL: pool.name}


def tolerations(pool: Pool) -> list[dict]:
    return [{**taint, "operator": "Equal"} for taint in node_taints(pool)]
