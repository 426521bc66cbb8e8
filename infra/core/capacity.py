"""What the add-ons run on the system node group, and whether its desiredSize holds it.

Nothing scales the system node group (no cluster autoscaler; Karpenter manages only its
NodePools), so its desiredSize nodes are all the controllers get. A pod placed there that does
not fit stays Pending and `pulumi up` fails at its Helm release's readiness wait; a controller
that does not tolerate the system taint lands on a pool instead, and keeps a pool node running
day and night. Both are found here from the declared resources, as the plan records them
offline and the engine hands them to the policy pack:

- Helm releases: each chart's pod-making components (an integration's `charts`), placed and
  sized by the values we pass laid over the chart's defaults at the pinned version;
- EKS add-ons (an integration's `addons`) and pulumi-eks's own (vpc-cni, kube-proxy), at their
  defaults, placed by the configurationValues we pass;
- the kustomize overlays (`overlays`), placed on the system nodes by deploy/manifests/system-nodes;
- the Deployments, DaemonSets, StatefulSets and CronJobs the program declares itself.

Which resource runs which pods is each integration's own knowledge (its `pods`,
infra/core/facts.py); infra/core/pods.py holds the model they share, this module the fit.

Node affinity is matched for `In`, `NotIn`, `Exists` and `DoesNotExist` against the system nodes'
labels; other scheduling rules (pod anti-affinity, spread) are not modelled: the fit is a sum of
requests against a sum of allocatable, with every pod required to fit one node.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from infra.core.catalog import load_catalog
from infra.core.declared import Declared
from infra.core.facts import Facts
from infra.core.pods import SYSTEM_PLACED, PodSet, Requests, at

# EC2 keeps part of an instance's memory from the OS; Karpenter assumes 7.5 % (its
# VM_MEMORY_OVERHEAD_PERCENT default), as infra/karpenter/config.py does.
VM_MEMORY_OVERHEAD = 0.075
# What the kubelet keeps on an AL2023 node (awslabs/amazon-eks-ami nodeadm/internal/kubelet/
# config.go at 81fec2e8, 2026-07-23): CPU 6 % of the first core, 1 % of the second, 0.5 % of the
# third and fourth, 0.25 % of the rest (getCPUMillicoresToReserve); memory 11 MiB a pod of maxPods
# plus 255 MiB (getMemoryMebibytesToReserve); eviction at 100 MiB available (EvictionHard).
CPU_RESERVED = ((1000, 0.06), (1000, 0.01), (2000, 0.005), (math.inf, 0.0025))
EVICTION_MIB = 100
# maxPods by size for the CPU families the system node group may use (m5, m6i, m7i, c6i, c7i):
# ENIs x (IPv4 per ENI - 1) + 2 from nodeadm's instance-info.jsonl (same file): large 3 x 10,
# xlarge and 2xlarge 4 x 15, 4xlarge 8 x 30. EKS managed node groups cap it at 110 on instances
# under 30 vCPU (EKS user guide, "Amazon EKS recommended maximum Pods", read from memory).
MAX_PODS = {"large": 29, "xlarge": 58, "2xlarge": 58, "4xlarge": 110}


def addon_pod_sets(addon: str, configuration: object, facts: Facts) -> list[PodSet]:
    sets = []
    for pods in facts.addons.get(addon, []):
        selector = at(configuration, pods.selector_values) if pods.selector_values else None
        sets.append(
            PodSet(
                addon,
                pods.component,
                pods.replicas,
                pods.daemonset,
                pods.each,
                selector or {},
                pods.tolerations,
                {},
                pods.source,
            )
        )
    return sets


def overlay_pod_sets(r: Declared, directory: str, facts: Facts) -> list[PodSet]:
    if directory not in facts.overlays:
        # Its Deployments would go unaccounted on the system nodes (the JobSet controller once did).
        raise LookupError(
            f"kustomize overlay {directory}: no integration says which pods it runs; list them in "
            "its integration's overlays (infra/<integration>/facts.py, OverlayPods)"
        )
    selector, tolerations = SYSTEM_PLACED
    return [
        PodSet(r.name, p.component, 1, False, p.requests, selector, tolerations, {}, p.source)
        for p in facts.overlays[directory]
    ]


def pod_sets(stack: Sequence[Declared], facts: Facts) -> list[PodSet]:
    """Every add-on pod set the stack declares, as placed and sized by what the program passes:
    each resource's pods as the integration that declares its kind reads them."""
    readers = [i.pods for i in facts.integrations if i.pods]
    return [pods for r in stack for read in readers for pods in read(r, stack, facts)]


def allocatable(instance_type: str) -> Requests:
    """What the kubelet offers pods on one AL2023 node of this type."""
    kind = load_catalog()[instance_type]
    millicores, reserved, left = kind.vcpu * 1000, 0.0, kind.vcpu * 1000
    for width, share in CPU_RESERVED:
        taken = min(left, width)
        reserved += taken * share
        left -= taken
    max_pods = MAX_PODS[instance_type.split(".", 1)[1]]
    memory = kind.memory_gib * 1024 * (1 - VM_MEMORY_OVERHEAD)
    memory -= 11 * max_pods + 255 + EVICTION_MIB
    return Requests((millicores - reserved) / 1000, memory)


@dataclass(frozen=True)
class SystemFit:
    instance_type: str
    desired: int
    per_node: Requests  # allocatable less the DaemonSets on every system node
    placed: list[PodSet]  # non-DaemonSet pods that may run on the system nodes
    daemonsets: list[PodSet]  # on every system node
    stray: list[PodSet]  # non-DaemonSet pods the system nodes refuse: they land on a pool
    too_big: list[PodSet]  # pods no single system node can hold

    @property
    def requested(self) -> Requests:
        total = Requests()
        for pods in self.placed:
            total = total + pods.each * pods.replicas
        return total

    @property
    def needed(self) -> int:
        """The fewest system nodes whose room holds every placed pod's requests."""
        asked = self.requested
        if self.per_node.cpu <= 0 or self.per_node.memory_mib <= 0:
            return math.inf  # type: ignore[return-value]
        return max(
            1,
            math.ceil(asked.cpu / self.per_node.cpu - 1e-9),
            math.ceil(asked.memory_mib / self.per_node.memory_mib - 1e-9),
        )

    @property
    def fits(self) -> bool:
        return not self.too_big and self.needed <= self.desired


def system_fit(stack: Sequence[Declared], facts: Facts) -> SystemFit | None:
    """The system node group's fit, or None when the stack declares none."""
    found = [i.system_nodes(stack) for i in facts.integrations if i.system_nodes]
    nodes = next((n for n in found if n), None)
    if nodes is None:
        return None
    instance_type, desired = nodes.instance_type, nodes.desired
    sets = pod_sets(stack, facts)
    on_system = [s for s in sets if s.may_run_on_system_nodes()]
    daemonsets = [s for s in on_system if s.daemonset]
    overhead = Requests()
    for pods in daemonsets:
        overhead = overhead + pods.each
    room = allocatable(instance_type)
    per_node = Requests(room.cpu - overhead.cpu, room.memory_mib - overhead.memory_mib)
    placed = [s for s in on_system if not s.daemonset]
    return SystemFit(
        instance_type,
        desired,
        per_node,
        placed,
        daemonsets,
        stray=[s for s in sets if not s.daemonset and not s.may_run_on_system_nodes()],
        too_big=[s for s in placed if not s.each.fits(per_node)],
    )
