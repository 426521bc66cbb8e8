"""The AWS tags the stack's resources carry: what the bill is split by.

Every resource the stack declares carries the stack and cluster tags; what serves one pool (its
nodes, their volumes and network interfaces) carries the pool, and what serves one namespace (a
DevServer user's home volumes and SSH load balancer) carries the namespace. infra/billing
activates these keys as cost allocation tags, so Cost Explorer and the Cost and Usage Report can
group by them.
"""

STACK_TAG = "training-platform:stack"
CLUSTER_TAG = "training-platform:cluster"
# The pool a node serves: Karpenter's EC2NodeClass tags its instances with their NodePool; the
# system node group's launch template tags its own as SYSTEM_POOL.
POOL_TAG = "training-platform/pool"
SYSTEM_POOL = "system"
NAMESPACE_TAG = "training-platform:namespace"
COST_ALLOCATION_TAGS = (STACK_TAG, CLUSTER_TAG, POOL_TAG, NAMESPACE_TAG)


def stack_tags(stack: str, cluster_name: str) -> dict[str, str]:
    return {STACK_TAG: stack, CLUSTER_TAG: cluster_name}


def as_list(tags: dict[str, str]) -> str:
    """`k=v,k=v`: the form a LoadBalancer Service's additional-resource-tags annotation takes."""
    return ",".join(f"{key}={value}" for key, value in tags.items())
