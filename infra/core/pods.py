"""Pods as the capacity check sees them: what each asks for, where it may run, and how a chart's
values, a workload's template or an add-on's defaults make them (infra/core/capacity.py sums
them against the system nodes)."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from infra.core.declared import Declared, dig, listed, quantity
from infra.core.nodes import SYSTEM_NODE_LABEL, SYSTEM_TAINT_KEY

# Well-known labels every system node carries besides ours (kubelet sets them).
SYSTEM_LABELS = {**SYSTEM_NODE_LABEL, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
SYSTEM_TAINT = {"key": SYSTEM_TAINT_KEY, "value": "true", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Requests:
    cpu: float = 0.0  # cores
    memory_mib: float = 0.0

    def __add__(self, other: "Requests") -> "Requests":
        return Requests(self.cpu + other.cpu, self.memory_mib + other.memory_mib)

    def __mul__(self, n: float) -> "Requests":
        return Requests(self.cpu * n, self.memory_mib * n)

    def fits(self, room: "Requests") -> bool:
        return self.cpu <= room.cpu + 1e-9 and self.memory_mib <= room.memory_mib + 1e-9


def requests_of(resources: object) -> Requests:
    """A container's (or a chart value's) resources.requests; limits stand in where requests are
    missing, as the API server defaults them."""
    asked = dig(resources, "requests") or dig(resources, "limits") or {}
    cpu, memory = dig(asked, "cpu"), dig(asked, "memory")
    return Requests(
        quantity(cpu) if cpu is not None else 0.0,
        quantity(memory) / 2**20 if memory is not None else 0.0,
    )


@dataclass(frozen=True)
class PodSet:
    """Pods of one add-on component: how many, what each asks, and where they may go."""

    owner: str  # the release, add-on, overlay or workload
    component: str
    replicas: int  # per node for a DaemonSet
    daemonset: bool
    each: Requests
    node_selector: Mapping[str, str]
    tolerations: Sequence[Mapping]
    affinity: Mapping = field(default_factory=dict)
    source: str = "the values we pass"

    @property
    def name(self) -> str:
        return f"{self.owner}/{self.component}"

    def may_run_on_system_nodes(self) -> bool:
        selected = all(SYSTEM_LABELS.get(k) == v for k, v in self.node_selector.items())
        return selected and _affinity_allows(self.affinity) and tolerates(self.tolerations)


def tolerates(tolerations: Sequence[Mapping], taint: Mapping = SYSTEM_TAINT) -> bool:
    """Kubernetes' ToleratesTaint: an empty key with Exists tolerates every taint."""
    for t in tolerations:
        effect = dig(t, "effect")
        if effect and effect != taint["effect"]:
            continue
        key, operator = dig(t, "key"), dig(t, "operator") or "Equal"
        if not key and operator == "Exists":
            return True
        if key == taint["key"] and (operator == "Exists" or dig(t, "value") == taint["value"]):
            return True
    return False


def _affinity_allows(affinity: Mapping) -> bool:
    terms = dig(
        affinity,
        "nodeAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        "nodeSelectorTerms",
    )
    if not terms:
        return True

    def matches(expression: Mapping) -> bool:
        key, operator = dig(expression, "key"), dig(expression, "operator")
        values = [str(v) for v in listed(dig(expression, "values"))]
        value = SYSTEM_LABELS.get(key)
        return {
            "In": value in values,
            "NotIn": value not in values,
            "Exists": value is not None,
            "DoesNotExist": value is None,
        }.get(operator, False)

    return any(all(matches(e) for e in listed(dig(t, "matchExpressions"))) for t in terms)


@dataclass(frozen=True)
class ChartPods:
    """One pod-making component of a chart: where its values place and size it, and the chart's
    defaults at the pinned version for what we do not pass."""

    component: str
    placement: str  # dotted path of the values holding nodeSelector and tolerations ("" = top)
    resources: str  # dotted path of its resources (requests)
    default_requests: Requests
    source: str  # where the defaults were read
    replicas: str | None = None  # dotted path of its replica count
    default_replicas: int = 1
    daemonset: bool = False
    default_selector: Mapping[str, str] = field(default_factory=dict)
    default_tolerations: Sequence[Mapping] = ()
    # Other containers of the pod, sized by the chart (e.g. sidecars), added to each pod.
    extra: Requests = Requests()


def at(values: object, path: str) -> object:
    return dig(values, *path.split(".")) if path else values


def chart_pod_sets(release: str, values: object, components: Sequence[ChartPods]) -> list[PodSet]:
    sets = []
    for c in components:
        placed = at(values, c.placement)
        resources = at(values, c.resources)
        replicas = at(values, c.replicas) if c.replicas else None
        sets.append(
            PodSet(
                release,
                c.component,
                1 if c.daemonset else int(replicas if replicas is not None else c.default_replicas),
                c.daemonset,
                (requests_of(resources) if resources else c.default_requests) + c.extra,
                dig(placed, "nodeSelector") or c.default_selector,
                listed(dig(placed, "tolerations")) or list(c.default_tolerations),
                dig(placed, "affinity") or {},
                "the values we pass" if resources else c.source,
            )
        )
    return sets


CRITICAL_ADDONS = [{"key": SYSTEM_TAINT_KEY, "operator": "Exists"}]
EVERY_TAINT = [{"operator": "Exists"}]
GPU_ONLY = "GPU nodes only, not read: never on the system nodes"


@dataclass(frozen=True)
class AddonPods:
    component: str
    replicas: int  # per node for a DaemonSet
    daemonset: bool
    each: Requests
    tolerations: Sequence[Mapping]
    source: str
    selector_values: str | None = None  # configurationValues path of its nodeSelector


@dataclass(frozen=True)
class OverlayPods:
    """A Deployment of a kustomize overlay: on the system nodes (deploy/manifests/system-nodes),
    with the requests upstream sets."""

    component: str
    source: str
    requests: Requests = field(default_factory=Requests)


SYSTEM_PLACED = (SYSTEM_NODE_LABEL, [{"key": SYSTEM_TAINT_KEY, "operator": "Exists"}])


def workload_pod_sets(r: Declared, daemonset: bool) -> list[PodSet]:
    spec = dig(r.props, "spec")
    template = dig(spec, "jobTemplate", "spec", "template", "spec") or dig(spec, "template", "spec")
    each = Requests()
    for container in listed(dig(template, "containers")):
        each = each + requests_of(dig(container, "resources"))
    replicas = 1 if daemonset else int(dig(spec, "replicas") or 1)
    name = dig(r.props, "metadata", "name") or r.name
    return [
        PodSet(
            name,
            str(dig(r.props, "kind") or r.type.rsplit(":", 1)[-1]),
            replicas,
            daemonset,
            each,
            dig(template, "nodeSelector") or {},
            listed(dig(template, "tolerations")),
            dig(template, "affinity") or {},
            "its pod template",
        )
    ]
