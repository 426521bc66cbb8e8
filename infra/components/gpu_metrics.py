"""GPU metrics: the DCGM exporter on GPU nodes, optionally Prometheus and Grafana to watch them."""

import pulumi
import pulumi_kubernetes as k8s

from infra.components.helm import helm_release
from infra.components.hybrid_nodes import GPU_AGENT_TOLERATIONS
from infra.components.node_pools import GPU_NODE_LABELS
from infra.versions import DCGM_EXPORTER_CHART, KUBE_PROMETHEUS_STACK_CHART

NAMESPACE = "monitoring"
# Grafana.com dashboard "NVIDIA DCGM Exporter Dashboard": utilisation, memory, power per GPU,
# with pod and namespace labels, i.e. per job.
DCGM_DASHBOARD_GNET_ID = 12239


class GpuMetrics(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        provider: k8s.Provider,
        prometheus_stack: bool,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:GpuMetrics", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        depends: list[pulumi.Resource] = []
        if prometheus_stack:
            depends.append(
                helm_release(
                    "kube-prometheus-stack",
                    KUBE_PROMETHEUS_STACK_CHART,
                    NAMESPACE,
                    {
                        # Pick up ServiceMonitors from every release, not only this chart's own.
                        "prometheus": {
                            "prometheusSpec": {"serviceMonitorSelectorNilUsesHelmValues": False}
                        },
                        "grafana": {
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
        helm_release(
            "dcgm-exporter",
            DCGM_EXPORTER_CHART,
            NAMESPACE,
            {
                "nodeSelector": GPU_NODE_LABELS,
                "tolerations": GPU_AGENT_TOLERATIONS,
                # The ServiceMonitor CRD comes with kube-prometheus-stack.
                "serviceMonitor": {"enabled": prometheus_stack},
            },
            pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=depends)),
        )
        self.register_outputs({})
