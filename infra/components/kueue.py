"""Kueue: admission control for training jobs, with the Kubeflow integrations switched on."""

import pulumi
import pulumi_kubernetes as k8s
import yaml

from infra.components.helm import helm_release
from infra.components.queues import TEAM_LABEL
from infra.components.system_nodes import SYSTEM_PLACEMENT
from infra.versions import KUEUE_CHART

NAMESPACE = "kueue-system"
# pytorchjob is off by default in Kueue 0.19 and must be listed; mpijob is on but listed anyway
# because this list replaces the default one. DevServers are StatefulSets: `statefulset` admits
# one as a single pod group (all pods or none; 0.19 allows only scaling to and from zero) and
# needs `pod`, whose webhook gates the pods.
FRAMEWORKS = [
    "batch/job",
    "kubeflow.org/pytorchjob",
    "kubeflow.org/mpijob",
    "pod",
    "statefulset",
]
# Kueue 0.19 checks every requested resource against quota (BlockUndeclared): a pod asking for
# one no ClusterQueue covers is never admitted. EFA interfaces (vpc.amazonaws.com/efa) come with
# the nodes a job's GPUs already pay for, so they are not queued for.
EXCLUDED_RESOURCE_PREFIXES = ["vpc.amazonaws.com/"]


def manager_config() -> dict:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) as the chart takes it."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443", "enableClusterQueueResources": True},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "manageJobsWithoutQueueName": False,
        # Only the platform's team and DevServer namespaces (all labelled with their team). The
        # chart gives the pod webhook (failurePolicy Fail) this selector too: without it every
        # pod outside kube-system and kueue-system would wait on Kueue's webhook, so a Kueue
        # outage would stop pods from starting cluster-wide (monitoring, Karpenter, CSI, ...).
        "managedJobsNamespaceSelector": {
            "matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]
        },
        # All-or-nothing admission: a job that cannot get every pod running within the timeout
        # gives its quota back and is requeued with exponential backoff, so two half-admitted
        # jobs never deadlock the GPUs. In v1beta2 the block's presence switches it on.
        "waitForPodsReady": {
            "timeout": "10m",
            "blockAdmission": True,
            "recoveryTimeout": "3m",
            "requeuingStrategy": {
                "timestamp": "Eviction",
                "backoffLimitCount": 5,
                "backoffBaseSeconds": 60,
                "backoffMaxSeconds": 3600,
            },
        },
        "integrations": {"frameworks": FRAMEWORKS},
        "resources": {"excludeResourcePrefixes": EXCLUDED_RESOURCE_PREFIXES},
    }


class Kueue(pulumi.ComponentResource):
    release: pulumi.Resource

    def __init__(
        self,
        name: str,
        provider: k8s.Provider,
        depends_on: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:Kueue", name, None, opts)
        self.release = helm_release(
            "kueue",
            KUEUE_CHART,
            NAMESPACE,
            {
                "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(manager_config())},
                # Two replicas (one leads) and a PDB: a node drain never stops admission.
                "controllerManager": {
                    "replicas": 2,
                    "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
                    **SYSTEM_PLACEMENT,
                },
            },
            # The job CRDs must exist before Kueue starts watching them; on destroy Kueue stays
            # until the queues and workloads (and their finalizers) are gone.
            pulumi.ResourceOptions(parent=self, provider=provider, depends_on=depends_on),
        )
        self.register_outputs({})
