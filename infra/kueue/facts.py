"""What the platform knows about Kueue's kinds (Kubernetes objects, free) and its chart's pods.
A ResourceFlavor that stands for hybrid machines is priced by the hybrid integration."""

from infra.core.facts import K8S_OBJECT, ImmutableRule, Kind
from infra.core.pods import ChartPods, Requests

# Kueue's CRDs at the pinned version (tests/crds/SOURCES.md says where each was read).
KUEUE_CRDS = "kueue v0.20.7 CRD kueue.x-k8s.io_"
KINDS = (
    Kind("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue", free=K8S_OBJECT),
    Kind(
        "kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue",
        free=K8S_OBJECT,
        immutable=ImmutableRule(
            ("spec.clusterQueue",),
            f"{KUEUE_CRDS}localqueues.yaml, spec.clusterQueue: self == oldSelf",
            "remove the queue in one `pulumi up` (its pending jobs wait; a running one keeps "
            "running) and add it back under its new ClusterQueue in the next",
        ),
    ),
    Kind("kubernetes:kueue.x-k8s.io/v1beta2:Topology", free=K8S_OBJECT),
)

# A team's namespace (infra/kueue/queues.py) as a data holder, and what losing it loses.
TEAMS = "queues.teams"
HOLDERS = {
    TEAMS: "the team's namespace: its running jobs are killed and its claims deleted; the team's "
    "EFS directory and FSx files stay, its S3 checkpoints stay",
}


def team_holder(team: str) -> str:
    return f"{TEAMS}[{team}]"


CHARTS = {
    "oci://registry.k8s.io/kueue/charts/kueue": [
        ChartPods(
            "controller-manager",
            "controllerManager",
            "controllerManager.manager.resources",
            Requests(0.5, 512),
            "kubernetes-sigs/kueue charts/kueue/values.yaml (v0.19.2, main ff69552e): 500m, 512Mi",
            replicas="controllerManager.replicas",
        )
    ],
}
