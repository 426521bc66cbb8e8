"""The pods of the GPU charts: device plugins and the DCGM exporter run on GPU nodes only; the
monitoring stack's components on the system nodes, at the requests we pass."""

from infra.core.pods import GPU_ONLY, ChartPods, Requests

KPS = (
    "prometheus-community/helm-charts kube-prometheus-stack-88.5.3 "
    "charts/kube-prometheus-stack/values.yaml"
)


CHARTS = {
    "nvidia-device-plugin": [
        ChartPods("device-plugin", "", "resources", Requests(), GPU_ONLY, daemonset=True)
    ],
    "aws-efa-k8s-device-plugin": [
        ChartPods("device-plugin", "", "resources", Requests(), GPU_ONLY, daemonset=True)
    ],
    "dcgm-exporter": [ChartPods("exporter", "", "resources", Requests(), GPU_ONLY, daemonset=True)],
    # 88.6.5 is pinned; the newest tag stored where this was written is 88.5.3 (2026-08-22),
    # whose keys are the ones here. Every component's requests are ours (metrics.py): the
    # chart's are all {} (BestEffort pods the scheduler would place anywhere with no room
    # reserved).
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
