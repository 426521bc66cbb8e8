"""What the add-ons run on the system node group, and whether its desiredSize holds it.

Nothing scales the system node group (no cluster autoscaler; Karpenter manages only its
NodePools), so its desiredSize nodes are all the controllers get. A pod placed there that does
not fit stays Pending and `pulumi up` fails at its Helm release's readiness wait; a controller
that does not tolerate the system taint lands on a pool instead, and keeps a pool node running
day and night. Both are found here from the declared resources, as the plan records them
offline and the engine hands them to the policy pack:

- Helm releases: each chart's pod-making components (CHARTS), placed and sized by the values we
  pass laid over the chart's defaults at the pinned version;
- EKS add-ons (ADDONS) and pulumi-eks's own (vpc-cni, kube-proxy), at their defaults, placed by
  the configurationValues we pass;
- the kustomize overlays (OVERLAYS), placed on the system nodes by deploy/manifests/system-nodes;
- the Deployments, DaemonSets, StatefulSets and CronJobs the program declares itself.

Node affinity is matched for `In`, `NotIn`, `Exists` and `DoesNotExist` against the system nodes'
labels; other scheduling rules (pod anti-affinity, spread) are not modelled: the fit is a sum of
requests against a sum of allocatable, with every pod required to fit one node.
"""

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from infra.core.catalog import load_catalog
from infra.core.declared import Declared, dig, listed, quantity
from infra.core.resource_types import (
    EKS_ADDON,
    EKS_CLUSTER,
    EKS_COMPONENT,
    HELM_RELEASE,
    NODE_GROUP,
    OVERLAY,
)
from infra.core.system_nodes import SYSTEM_NODE_LABEL, SYSTEM_TAINT_KEY

WORKLOADS = {
    "kubernetes:apps/v1:Deployment": False,
    "kubernetes:apps/v1:StatefulSet": False,
    "kubernetes:apps/v1:DaemonSet": True,
    "kubernetes:batch/v1:CronJob": False,
    "kubernetes:batch/v1:Job": False,
}
# Well-known labels every system node carries besides ours (kubelet sets them).
SYSTEM_LABELS = {**SYSTEM_NODE_LABEL, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
SYSTEM_TAINT = {"key": SYSTEM_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
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


def _at(values: object, path: str) -> object:
    return dig(values, *path.split(".")) if path else values


def _chart_pod_sets(release: str, values: object, components: Sequence[ChartPods]) -> list[PodSet]:
    sets = []
    for c in components:
        placed = _at(values, c.placement)
        resources = _at(values, c.resources)
        replicas = _at(values, c.replicas) if c.replicas else None
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
KPS = (
    "prometheus-community/helm-charts kube-prometheus-stack-88.5.3 "
    "charts/kube-prometheus-stack/values.yaml"
)
# Pod-making components of each chart the program installs, by chart (ChartPin.chart). Requests
# read from each chart's values.yaml at the pinned version unless the source says otherwise.
CHARTS: dict[str, list[ChartPods]] = {
    "oci://public.ecr.aws/karpenter/karpenter": [
        ChartPods(
            "controller",
            "",
            "controller.resources",
            Requests(),
            "aws/karpenter-provider-aws v1.14.1 charts/karpenter/values.yaml: resources {}",
            replicas="replicas",
            default_replicas=2,
            default_selector={"kubernetes.io/os": "linux"},
            default_tolerations=CRITICAL_ADDONS,
        )
    ],
    "oci://public.ecr.aws/karpenter/karpenter-crd": [],
    "oci://registry.k8s.io/kueue/charts/kueue": [
        ChartPods(
            "controller-manager",
            "controllerManager",
            "controllerManager.manager.resources",
            Requests(0.5, 512),
            "kubernetes-sigs/kueue v0.19.2 charts/kueue/values.yaml: 500m, 512Mi",
            replicas="controllerManager.replicas",
        )
    ],
    "nvidia-device-plugin": [
        ChartPods("device-plugin", "", "resources", Requests(), GPU_ONLY, daemonset=True)
    ],
    "aws-efa-k8s-device-plugin": [
        ChartPods("device-plugin", "", "resources", Requests(), GPU_ONLY, daemonset=True)
    ],
    "dcgm-exporter": [ChartPods("exporter", "", "resources", Requests(), GPU_ONLY, daemonset=True)],
    "oci://public.ecr.aws/eks/cilium/cilium": [
        ChartPods(
            "agent",
            "",
            "resources",
            Requests(),
            "hybrid nodes only (its affinity): never on the system nodes",
            daemonset=True,
            default_tolerations=EVERY_TAINT,
        ),
        ChartPods(
            "operator",
            "operator",
            "operator.resources",
            Requests(),
            "cilium/cilium chart values.yaml: operator.resources {} (read from memory)",
            replicas="operator.replicas",
            default_replicas=2,
        ),
    ],
    # 88.6.5 is pinned; the newest tag stored where this was written is 88.5.3 (2026-08-22), whose
    # keys are the ones here. Every component's requests are ours (gpu_metrics.py): the chart's
    # are all {} (BestEffort pods the scheduler would place anywhere with no room reserved).
    "kube-prometheus-stack": [
        ChartPods(
            "prometheus",
            "prometheus.prometheusSpec",
            "prometheus.prometheusSpec.resources",
            Requests(),
            f"{KPS}: prometheus.prometheusSpec.resources {{}}",
            replicas="prometheus.prometheusSpec.replicas",
            # The operator adds its config-reloader container: 10m, 50Mi (prometheus-operator
            # defaults --config-reloader-cpu-request/-memory-request, read from memory).
            extra=Requests(0.01, 50),
        ),
        ChartPods(
            "alertmanager",
            "alertmanager.alertmanagerSpec",
            "alertmanager.alertmanagerSpec.resources",
            Requests(),
            f"{KPS}: alertmanager.alertmanagerSpec.resources {{}}",
            replicas="alertmanager.alertmanagerSpec.replicas",
            extra=Requests(0.01, 50),
        ),
        ChartPods(
            "operator",
            "prometheusOperator",
            "prometheusOperator.resources",
            Requests(),
            f"{KPS}: prometheusOperator.resources {{}}",
        ),
        ChartPods(
            "admission-webhook-patch",
            "prometheusOperator.admissionWebhooks.patch",
            "prometheusOperator.admissionWebhooks.patch.resources",
            Requests(),
            f"{KPS}: a Job at install and upgrade; resources {{}}",
        ),
        ChartPods(
            "kube-state-metrics",
            "kube-state-metrics",
            "kube-state-metrics.resources",
            Requests(),
            "prometheus-community/helm-charts kube-state-metrics-8.4.0 values.yaml: resources {}",
            replicas="kube-state-metrics.replicas",
        ),
        ChartPods(
            "grafana",
            "grafana",
            "grafana.resources",
            Requests(),
            "grafana-community/helm-charts grafana-12.11.1 values.yaml: resources {}",
            replicas="grafana.replicas",
        ),
        ChartPods(
            "node-exporter",
            "prometheus-node-exporter",
            "prometheus-node-exporter.resources",
            Requests(),
            "prometheus-community/helm-charts prometheus-node-exporter-4.56.1 values.yaml: "
            "resources {}, tolerates every NoSchedule taint",
            daemonset=True,
            default_selector={"kubernetes.io/os": "linux"},
            default_tolerations=[{"effect": "NoSchedule", "operator": "Exists"}],
        ),
    ],
}


@dataclass(frozen=True)
class AddonPods:
    component: str
    replicas: int  # per node for a DaemonSet
    daemonset: bool
    each: Requests
    tolerations: Sequence[Mapping]
    source: str
    selector_values: str | None = None  # configurationValues path of its nodeSelector


EBS_CHART = "kubernetes-sigs/aws-ebs-csi-driver v1.51.1 charts/aws-ebs-csi-driver/values.yaml"
FSX_CHART = "kubernetes-sigs/aws-fsx-csi-driver v1.7.0 charts/aws-fsx-csi-driver/values.yaml"
# EKS add-ons at their defaults (the add-on's own manifests follow each project's chart).
ADDONS: dict[str, list[AddonPods]] = {
    "vpc-cni": [
        AddonPods(
            "aws-node",
            1,
            True,
            Requests(0.025, 0),
            EVERY_TAINT,
            "aws/amazon-vpc-cni-k8s v1.20.4 charts/aws-vpc-cni/values.yaml: 25m, tolerates all",
        )
    ],
    "kube-proxy": [
        AddonPods(
            "kube-proxy",
            1,
            True,
            Requests(0.1, 0),
            EVERY_TAINT,
            "EKS kube-proxy add-on manifest: 100m (read from memory)",
        )
    ],
    "coredns": [
        AddonPods(
            "coredns",
            2,
            False,
            Requests(0.1, 70),
            CRITICAL_ADDONS,
            "EKS CoreDNS add-on, as Kubernetes' cluster/addons/dns/coredns manifest: 2 replicas "
            "of 100m, 70Mi, tolerating CriticalAddonsOnly (read from memory)",
        )
    ],
    "eks-pod-identity-agent": [
        AddonPods(
            "agent",
            1,
            True,
            Requests(),
            EVERY_TAINT,
            "aws/eks-pod-identity-agent charts values.yaml: resources commented out, "
            "tolerations all",
        )
    ],
    "aws-ebs-csi-driver": [
        AddonPods(
            "controller",
            2,
            False,
            # ebs-plugin, provisioner, attacher, snapshotter, resizer, liveness-probe.
            Requests(0.01, 40) * 6,
            CRITICAL_ADDONS,
            f"{EBS_CHART}: controller.replicaCount 2, 10m and 40Mi in each of 6 containers",
            selector_values="controller.nodeSelector",
        ),
        AddonPods(
            "node",
            1,
            True,
            Requests(0.01, 40) * 3,
            EVERY_TAINT,
            f"{EBS_CHART}: node.tolerateAllTaints, 10m and 40Mi in each of 3 containers",
        ),
    ],
    "aws-efs-csi-driver": [
        AddonPods(
            "controller",
            2,
            False,
            Requests(),
            CRITICAL_ADDONS,
            "kubernetes-sigs/aws-efs-csi-driver v2.1.13 values.yaml: replicaCount 2, resources {}",
            selector_values="controller.nodeSelector",
        ),
        AddonPods(
            "node",
            1,
            True,
            Requests(),
            EVERY_TAINT,
            "kubernetes-sigs/aws-efs-csi-driver v2.1.13 values.yaml: resources {}",
        ),
    ],
    "aws-fsx-csi-driver": [
        AddonPods(
            "controller",
            2,
            False,
            Requests(0.01, 40) + Requests(0.01, 32) * 3,
            CRITICAL_ADDONS,
            f"{FSX_CHART}: replicaCount 2; plugin 10m/40Mi, 3 sidecars 10m/32Mi",
            selector_values="controller.nodeSelector",
        ),
        AddonPods(
            "node",
            1,
            True,
            Requests(0.01, 40) + Requests(0.01, 32) * 2,
            EVERY_TAINT,
            f"{FSX_CHART}: tolerateAllTaints; plugin 10m/40Mi, 2 sidecars 10m/32Mi",
        ),
    ],
    "eks-node-monitoring-agent": [
        AddonPods(
            "agent",
            1,
            True,
            Requests(0.01, 30),
            EVERY_TAINT,
            "aws/eks-node-monitoring-agent v1.7.0 charts values.yaml: 10m, 30Mi, tolerates all",
        )
    ],
}
# pulumi-eks's Cluster installs these add-ons itself (ours: cluster.py).
CLUSTER_ADDONS = ("vpc-cni", "kube-proxy")
SYSTEM_PLACED = (SYSTEM_NODE_LABEL, [{"key": SYSTEM_TAINT_KEY, "operator": "Exists"}])
# The overlays in deploy/manifests: their Deployments go to the system nodes (its system-nodes
# component); upstream sets no requests.
OVERLAYS = {
    "manifests/training-operator": [
        ("training-operator", "kubeflow/trainer v1.9.4 manifests/base/deployment.yaml: none")
    ],
    "manifests/mpi-operator": [
        ("mpi-operator", "kubeflow/mpi-operator v0.8.0 deploy/v2beta1/mpi-operator.yaml: none")
    ],
    "manifests/local-path-provisioner": [
        ("local-path-provisioner", "rancher/local-path-provisioner v0.0.37 deploy/: none")
    ],
}


def _workload_pod_sets(r: Declared, daemonset: bool) -> list[PodSet]:
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


def _addon_pod_sets(addon: str, configuration: object) -> list[PodSet]:
    sets = []
    for pods in ADDONS.get(addon, []):
        selector = _at(configuration, pods.selector_values) if pods.selector_values else None
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


def pod_sets(stack: Sequence[Declared]) -> list[PodSet]:
    """Every add-on pod set the stack declares, as placed and sized by what the program passes."""
    sets: list[PodSet] = []
    for r in stack:
        if r.type == HELM_RELEASE:
            chart = str(dig(r.props, "chart"))
            name = str(dig(r.props, "name") or r.name)
            sets += _chart_pod_sets(name, dig(r.props, "values") or {}, CHARTS.get(chart, []))
        elif r.type == EKS_ADDON:
            raw = dig(r.props, "configurationValues")
            configuration = json.loads(str(raw)) if raw else {}
            sets += _addon_pod_sets(str(dig(r.props, "addonName")), configuration)
        elif r.type == EKS_COMPONENT and not any(d.type == EKS_CLUSTER for d in stack):
            for addon in CLUSTER_ADDONS:
                sets += _addon_pod_sets(addon, {})
        elif r.type == OVERLAY:
            for component, source in OVERLAYS.get(str(dig(r.props, "directory")), []):
                selector, tolerations = SYSTEM_PLACED
                sets.append(
                    PodSet(
                        r.name, component, 1, False, Requests(), selector, tolerations, {}, source
                    )
                )
        elif r.type in WORKLOADS:
            sets += _workload_pod_sets(r, WORKLOADS[r.type])
    return sets


def unknown_charts(stack: Sequence[Declared]) -> list[str]:
    """Charts the stack installs that CHARTS does not describe: their pods are not counted."""
    return sorted(
        {
            str(dig(r.props, "chart"))
            for r in stack
            if r.type == HELM_RELEASE and str(dig(r.props, "chart")) not in CHARTS
        }
    )


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


def system_fit(stack: Sequence[Declared]) -> SystemFit | None:
    """The system node group's fit, or None when the stack declares none."""
    groups = [
        r
        for r in stack
        if r.type == NODE_GROUP
        and all(dig(r.props, "labels", k) == v for k, v in SYSTEM_NODE_LABEL.items())
    ]
    if not groups:
        return None
    group = groups[0]
    instance_type = str(listed(dig(group.props, "instanceTypes"))[0])
    desired = int(dig(group.props, "scalingConfig", "desiredSize") or 0)
    sets = pod_sets(stack)
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
