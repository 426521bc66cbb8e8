"""GPU metrics: the DCGM exporter on GPU nodes, optionally Prometheus and Grafana to watch them.

On the pools' GPU nodes the exporter reads DCGM through the host engine the node monitoring
agent runs there (node_monitoring_agent.py: one host engine per node); hybrid nodes have no
agent, so their exporter (a release of its own) embeds its host engine as the chart does.
"""

import pulumi

from infra.components.context import ClusterContext
from infra.components.helm import helm_release
from infra.components.hybrid_machines import GPU_AGENT_TOLERATIONS, HYBRID_NODE_AFFINITY
from infra.components.node_monitoring_agent import DCGM_HOST_ENGINE_PORT
from infra.components.node_pools import GPU_NODE_LABELS, GPU_TOLERATION
from infra.components.system_nodes import SYSTEM_PLACEMENT
from infra.versions import DCGM_EXPORTER_CHART, KUBE_PROMETHEUS_STACK_CHART

NAMESPACE = "monitoring"
# kube-prometheus-stack's components on the system nodes, with requests the plan can count
# against their room (infra/system_capacity.py): the chart requests nothing, so the scheduler
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
        if pool_host_engine is not None:
            helm_release(
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
        if hybrid_gpus:
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
        self.register_outputs({})
