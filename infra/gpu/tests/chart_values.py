"""kube-prometheus-stack's values, written down where the program's values must match them.

Read from prometheus-community/helm-charts at tag kube-prometheus-stack-88.5.3 (2026-08-22, the
newest tag stored where this was written; 88.6.5 is pinned in infra/core/versions.py and no copy of
it could be read), with its subcharts at the versions that tag's Chart.yaml names:
kube-state-metrics 8.4.0 and prometheus-node-exporter 4.56.1 (same repository, their own tags),
grafana 12.11.1 (grafana-community/helm-charts, tag grafana-12.11.1). Each entry: a values key
path that exists at that version, with the values.yaml line it was read at.
"""

KPS = "charts/kube-prometheus-stack/values.yaml"
KEYS = {
    # The Prometheus and Alertmanager custom resources' pod specs (the operator renders them).
    "prometheus.prometheusSpec.nodeSelector": f"{KPS}:4421",
    "prometheus.prometheusSpec.tolerations": f"{KPS}:4354",
    "prometheus.prometheusSpec.resources": f"{KPS}:4668",
    "prometheus.prometheusSpec.serviceMonitorSelectorNilUsesHelmValues": f"{KPS}:4476",
    "alertmanager.alertmanagerSpec.nodeSelector": f"{KPS}:1160",
    "alertmanager.alertmanagerSpec.tolerations": f"{KPS}:1198",
    "alertmanager.alertmanagerSpec.resources": f"{KPS}:1165",
    "prometheusOperator.nodeSelector": f"{KPS}:3434",
    "prometheusOperator.tolerations": f"{KPS}:3439",
    "prometheusOperator.resources": f"{KPS}:3412",
    # The certificate Jobs (pre- and post-install hooks; admissionWebhooks.patch.enabled: true).
    "prometheusOperator.admissionWebhooks.patch.nodeSelector": f"{KPS}:3144",
    "prometheusOperator.admissionWebhooks.patch.tolerations": f"{KPS}:3146",
    "prometheusOperator.admissionWebhooks.patch.resources": f"{KPS}:3135",
    # Subcharts: their values go under their names.
    "kube-state-metrics.nodeSelector": "kube-state-metrics-8.4.0 values.yaml:360",
    "kube-state-metrics.tolerations": "kube-state-metrics-8.4.0 values.yaml:376",
    "kube-state-metrics.resources": "kube-state-metrics-8.4.0 values.yaml:515",
    "grafana.nodeSelector": "grafana-12.11.1 values.yaml:438",
    "grafana.tolerations": "grafana-12.11.1 values.yaml:443",
    "grafana.resources": "grafana-12.11.1 values.yaml:427",
    "grafana.dashboardProviders": "grafana-12.11.1 values.yaml:880",
    "grafana.dashboards": "grafana-12.11.1 values.yaml:913",
    # Commented out in values.yaml (line 572); templates/_config.tpl:175 reads it.
    "grafana.adminPassword": "grafana-12.11.1 templates/_config.tpl:175",
    "prometheus-node-exporter.resources": "prometheus-node-exporter-4.56.1 values.yaml:334",
}
# Every component of the chart that makes pods with the chart's defaults and ours, as
# infra/core/capacity.py names them; off by default there: the admission webhook Deployment
# (prometheusOperator.admissionWebhooks.deployment.enabled: false, line 2900), Thanos Ruler
# (thanosRuler.enabled: false, 5307), the CRD upgrade Job (crds.upgradeJob.enabled: false, 40),
# the Windows exporter (windowsMonitoring.enabled: false, 369), Grafana's image renderer
# (imageRenderer.enabled: false); Grafana's test pod runs only under `helm test`.
COMPONENTS = {
    "prometheus",
    "alertmanager",
    "operator",
    "admission-webhook-patch",
    "kube-state-metrics",
    "grafana",
    "node-exporter",
}
# The one DaemonSet: node-exporter, which tolerates every NoSchedule taint by default
# (prometheus-node-exporter-4.56.1 values.yaml:471, `- effect: NoSchedule, operator: Exists`).
DAEMONSETS = {"node-exporter"}
