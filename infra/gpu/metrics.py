"""GPU metrics: the DCGM exporter on GPU nodes, optionally Prometheus and Grafana to watch them.

On the pools' GPU nodes the exporter reads DCGM through the host engine the node monitoring
agent runs there (node_monitoring_agent.py: one host engine per node); hybrid nodes have no
agent, so their exporter (a release of its own) embeds its host engine as the chart does.

None of it authenticates its clients: Prometheus' and Alertmanager's HTTP APIs answer whoever
connects (read every metric, silence alerts), the exporters serve metrics to anyone, and DCGM's
host engine takes commands from any client. Their protection is the network: NetworkPolicies
admit into the monitoring namespace only its own pods (and the API server, from the control
plane's subnets, to the Prometheus operator's admission webhook; the DevServer operator to the
exporters: devservers/component.py),
and to the host engine only the exporters. Grafana, which has logins, gets an admin password of
its own rather than one the chart picks.
"""

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from infra.core.context import ClusterContext
from infra.core.helm import helm_release
from infra.core.network_policies import admit_pods, from_control_plane, same_namespace
from infra.core.nodes import GPU_NODE_LABELS, GPU_TOLERATION, SYSTEM_PLACEMENT
from infra.core.versions import DCGM_EXPORTER_CHART, KUBE_PROMETHEUS_STACK_CHART
from infra.eks.node_monitoring_agent import DCGM_HOST_ENGINE_PORT
from infra.hybrid.machines import GPU_AGENT_TOLERATIONS, HYBRID_NODE_AFFINITY

NAMESPACE = "monitoring"
# The pods of the charts installed here, as their charts label them.
# dcgm-exporter chart (NVIDIA/dcgm-exporter deployment/templates/_helpers.tpl, selectorLabels).
EXPORTER_LABELS = {"app.kubernetes.io/name": "dcgm-exporter"}
# kube-prometheus-stack 88.5.3 templates/prometheus-operator/_prometheus-operator.tpl, with the
# release named kube-prometheus-stack; its webhook and metrics port (prometheusOperator.tls
# .internalPort, values.yaml:2846), which the chart's admission webhooks call through its Service.
OPERATOR_LABELS = {"app.kubernetes.io/name": "kube-prometheus-stack-prometheus-operator"}
OPERATOR_SELECTOR = {"matchLabels": OPERATOR_LABELS}
OPERATOR_WEBHOOK_PORT = 10250
# The node monitoring agent's host engine (eks-node-monitoring-agent v1.7.0
# charts/eks-node-monitoring-agent/templates/dcgm-daemonset.yaml), in the add-on's namespace.
HOST_ENGINE_LABELS = {"k8s-app": "dcgm-server"}
HOST_ENGINE_NAMESPACE = "kube-system"
# kube-prometheus-stack's components on the system nodes, with requests the plan can count
# against their room (infra/core/capacity.py): the chart requests nothing, so the scheduler
# would reserve nothing and Prometheus could starve the controllers. Prometheus' memory follows
# its active series: node-exporter and kubelet series for tens of nodes plus DCGM's per GPU are
# some 10^5 series, about 1-2 GiB (an assumption to replace with `prometheus_tsdb_head_series`
# and the pod's working set on a real cluster).
PROMETHEUS_RESOURCES = {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
SMALL_RESOURCES = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}
GRAFANA_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}
JOB_RESOURCES = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}
NODE_EXPORTER_RESOURCES = {
    "requests": {"cpu": "20m", "memory": "32Mi"},
    "limits": {"memory": "64Mi"},
}
# Grafana.com dashboard "NVIDIA DCGM Exporter Dashboard": utilisation, memory, power per GPU,
# with pod and namespace labels, i.e. per job.
DCGM_DASHBOARD_GNET_ID = 12239


class GpuMetrics(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cluster: ClusterContext,
        prometheus_stack: bool,
        # The node monitoring agent's add-on, whose host engine the pools' GPU nodes run; None
        # when the stack has no GPU pool.
        pool_host_engine: pulumi.Resource | None,
        hybrid_gpus: bool,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:GpuMetrics", name, None, opts)
        child = cluster.in_cluster(self)
        depends: list[pulumi.Resource] = []
        if prometheus_stack:
            # 160 random bits, a secret in the stack's state; Grafana reads it at its first
            # start on an empty database (the chart keeps none: no persistence).
            grafana_password = random.RandomBytes(
                f"{name}-grafana-admin", length=20, opts=pulumi.ResourceOptions(parent=self)
            )
            depends.append(
                helm_release(
                    "kube-prometheus-stack",
                    KUBE_PROMETHEUS_STACK_CHART,
                    NAMESPACE,
                    {
                        "prometheus": {
                            "prometheusSpec": {
                                # Pick up ServiceMonitors from every release, not this one's only.
                                "serviceMonitorSelectorNilUsesHelmValues": False,
                                **SYSTEM_PLACEMENT,
                                "resources": PROMETHEUS_RESOURCES,
                            }
                        },
                        "alertmanager": {
                            "alertmanagerSpec": {**SYSTEM_PLACEMENT, "resources": SMALL_RESOURCES}
                        },
                        "prometheusOperator": {
                            **SYSTEM_PLACEMENT,
                            "resources": SMALL_RESOURCES,
                            # Its certificate Jobs run at every install and upgrade.
                            "admissionWebhooks": {
                                "patch": {**SYSTEM_PLACEMENT, "resources": JOB_RESOURCES}
                            },
                        },
                        "kube-state-metrics": {**SYSTEM_PLACEMENT, "resources": SMALL_RESOURCES},
                        # A DaemonSet: the chart already tolerates every NoSchedule taint.
                        "prometheus-node-exporter": {"resources": NODE_EXPORTER_RESOURCES},
                        "grafana": {
                            **SYSTEM_PLACEMENT,
                            # Unset, kube-prometheus-stack 88.5.3 leaves it to the grafana chart,
                            # which makes a random one at install (grafana-12.11.1
                            # templates/_helpers.tpl grafana.password); set, it is known to the
                            # stack and the same on every install.
                            "adminPassword": pulumi.Output.secret(grafana_password.hex),
                            "resources": GRAFANA_RESOURCES,
                            "dashboardProviders": {
                                "dashboardproviders.yaml": {
                                    "apiVersion": 1,
                                    "providers": [
                                        {
                                            "name": "gpu",
                                            "folder": "GPU",
                                            "type": "file",
                                            "options": {"path": "/var/lib/grafana/dashboards/gpu"},
                                        }
                                    ],
                                }
                            },
                            "dashboards": {
                                "gpu": {
                                    "dcgm-exporter": {
                                        "gnetId": DCGM_DASHBOARD_GNET_ID,
                                        "revision": 2,
                                        "datasource": "Prometheus",
                                    }
                                }
                            },
                        },
                    },
                    child,
                )
            )
        # The ServiceMonitor CRD comes with kube-prometheus-stack.
        service_monitor = {"serviceMonitor": {"enabled": prometheus_stack}}
        releases = list(depends)
        if pool_host_engine is not None:
            exporter = helm_release(
                "dcgm-exporter",
                DCGM_EXPORTER_CHART,
                NAMESPACE,
                {
                    "nodeSelector": GPU_NODE_LABELS,
                    # Not the hybrid taint: hybrid nodes have no host engine to read.
                    "tolerations": [GPU_TOLERATION],
                    # dcgm-exporter connects to a running host engine when this is set (its
                    # --remote-hostengine-info flag, pkg/cmd/app.go); dcgm-server publishes
                    # the engine on the node's address (hostPort).
                    "extraEnv": [
                        {
                            "name": "NODE_IP",
                            "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}},
                        },
                        {
                            "name": "DCGM_REMOTE_HOSTENGINE_INFO",
                            "value": f"$(NODE_IP):{DCGM_HOST_ENGINE_PORT}",
                        },
                    ],
                    **service_monitor,
                },
                pulumi.ResourceOptions.merge(
                    child, pulumi.ResourceOptions(depends_on=[*depends, pool_host_engine])
                ),
            )
            releases.append(exporter)
            self._policy(
                f"{name}-host-engine",
                HOST_ENGINE_NAMESPACE,
                "dcgm-host-engine-from-exporters",
                # Host port 5555 leads to the host engine's pod. The node monitoring agent, on the
                # same node's host network, is admitted as the pod's node.
                admit_pods(HOST_ENGINE_LABELS, NAMESPACE, EXPORTER_LABELS, DCGM_HOST_ENGINE_PORT),
                cluster.in_cluster(self, pool_host_engine),
            )
        if hybrid_gpus:
            releases.append(
                helm_release(
                    "dcgm-exporter-hybrid",
                    DCGM_EXPORTER_CHART,
                    NAMESPACE,
                    {
                        "nodeSelector": GPU_NODE_LABELS,
                        "affinity": HYBRID_NODE_AFFINITY,
                        "tolerations": GPU_AGENT_TOLERATIONS,
                        **service_monitor,
                    },
                    pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=depends)),
                )
            )
        # The namespace exists once a release has made it.
        in_namespace = cluster.in_cluster(self, *releases)
        self._policy(
            f"{name}-own-pods", NAMESPACE, "monitoring-own-pods", same_namespace(), in_namespace
        )
        if prometheus_stack:
            self._policy(
                f"{name}-operator-webhook",
                NAMESPACE,
                "prometheus-operator-webhook",
                # Its admission webhook (PrometheusRules, AlertmanagerConfigs), from the API server.
                from_control_plane(
                    cluster.vpc.control_plane_sources, [OPERATOR_WEBHOOK_PORT], OPERATOR_SELECTOR
                ),
                in_namespace,
            )
        self.register_outputs({})

    def _policy(self, name: str, namespace: str, policy: str, spec: dict, opts) -> None:
        k8s.networking.v1.NetworkPolicy(
            name, metadata={"name": policy, "namespace": namespace}, spec=spec, opts=opts
        )
