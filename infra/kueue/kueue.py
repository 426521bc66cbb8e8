"""Kueue: admission control for training jobs, with the Kubeflow integrations switched on."""

import pulumi
import yaml

from infra.core.context import ClusterContext
from infra.core.helm import helm_release
from infra.core.network_policies import platform_namespace
from infra.core.nodes import SYSTEM_PLACEMENT
from infra.core.versions import KUEUE_CHART
from infra.karpenter.cold_start import duration, pods_ready_timeouts
from infra.karpenter.config import NodePoolConfig
from infra.kueue.queues import TEAM_LABEL

NAMESPACE = "kueue-system"
# What the API server calls on Kueue's pods (charts/kueue/templates/manager/manager.yaml, at
# v0.19.2 and main ff69552e): its admission and CRD-conversion webhooks on 9443, and on 8082 its
# visibility API, an aggregated API (templates/visibility/apiservice_v1beta2.yaml; feature gate
# VisibilityOnDemand, on by default since 0.9). Unreachable, the APIService turns unavailable,
# discovery fails for its group, and deleting any namespace stalls.
WEBHOOK_PORT, VISIBILITY_PORT = 9443, 8082
# pytorchjob is off by default since Kueue 0.19 (deprecated) and must be listed; mpijob and
# trainjob are on but listed anyway because this list replaces the default one
# (infra/operators/tests/trainer_rules.py: Kueue's trainjob integration). DevServers are
# StatefulSets: `statefulset` admits one as a single pod group (all pods or none; scaling only to
# and from zero) and needs `pod`, whose webhook gates the pods; it also holds a team member's own
# pods, which must name a queue (infra/teams/access.py POD_POLICY).
FRAMEWORKS = [
    "batch/job",
    "kubeflow.org/pytorchjob",
    "kubeflow.org/mpijob",
    "trainer.kubeflow.org/trainjob",
    "pod",
    "statefulset",
]
# Kueue checks every requested resource against quota (BlockUndeclared, its default): a pod
# asking for one no ClusterQueue covers is never admitted. EFA interfaces (vpc.amazonaws.com/efa)
# come with the nodes a job's GPUs already pay for, so they are not queued for.
EXCLUDED_RESOURCE_PREFIXES = ["vpc.amazonaws.com/"]


def wait_for_pods_ready(pools: list[NodePoolConfig]) -> dict:
    """All-or-nothing admission: a workload that cannot get every pod Ready within `timeout`
    gives its quota back and is requeued with a capped exponential backoff, so two half-admitted
    jobs never hold the GPUs against each other. In v1beta2 the block's presence switches it on.
    Field semantics checked in kueue v0.19.2, and for v0.20.7 at main ff69552e (the newest
    readable commit; infra/kueue/tests/kueue_rules.py): apis/config/v1beta2/configuration_types.go,
    pkg/controller/core/workload_controller.go, pkg/scheduler/scheduler.go."""
    timeouts = pods_ready_timeouts(pools)
    return {
        # The slowest pool's cold start (launch + image pull + process start,
        # infra/karpenter/cold_start.py) with margin: shorter, and a job whose nodes are merely
        # booting is evicted.
        "timeout": duration(timeouts.timeout_s),
        # blockAdmission stops ALL admission while any admitted workload in any ClusterQueue is
        # not PodsReady (Cache.podsReadyForAllAdmittedWorkloads walks every ClusterQueue) and no
        # workload can opt out: DevServers are Kueue workloads too, so one cold GPU DevServer, or
        # one whose image never pulls, would stall every training job for up to `timeout`. It
        # guards against partial admissions deadlocking when quota exceeds real capacity; here
        # quotas equal the NodePool ceilings Karpenter fills, and `timeout` still evicts a job
        # that cannot get all its nodes. Off.
        "blockAdmission": False,
        # Measured from a Ready workload's last PodsReady=False (a pod lost): a Spot replacement
        # of the slowest pool (the 2-minute notice, then a cold start of the new node) with
        # margin, so one interruption does not evict a whole elastic job.
        "recoveryTimeout": duration(timeouts.recovery_timeout_s),
        "requeuingStrategy": {
            "timestamp": "Eviction",
            # No backoffLimitCount: past that count Kueue deactivates the workload for good
            # (spec.active=false, reason RequeuingLimitExceeded, shown nowhere in `kubectl get
            # workloads`). Left unset, a workload is requeued forever with this capped backoff
            # (60 s, 120 s, ... at most an hour), and its Evicted condition says why.
            "backoffBaseSeconds": 60,
            "backoffMaxSeconds": 3600,
        },
    }


def manager_config(pools: list[NodePoolConfig]) -> dict:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) as the chart takes it. Kueue decodes
    it strictly (pkg/config/config.go: serializer.EnableStrict): an unknown field stops it."""
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
        "waitForPodsReady": wait_for_pods_ready(pools),
        "integrations": {"frameworks": FRAMEWORKS},
        "resources": {"excludeResourcePrefixes": EXCLUDED_RESOURCE_PREFIXES},
    }


class Kueue(pulumi.ComponentResource):
    release: pulumi.Resource

    def __init__(
        self,
        name: str,
        pools: list[NodePoolConfig],
        cluster: ClusterContext,
        job_operators: list[pulumi.Resource],  # their CRDs must exist before Kueue watches them
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:Kueue", name, None, opts)
        self.release = helm_release(
            "kueue",
            KUEUE_CHART,
            NAMESPACE,
            {
                "managerConfig": {
                    "controllerManagerConfigYaml": yaml.safe_dump(manager_config(pools))
                },
                # Two replicas (one leads) and a PDB: a node drain never stops admission.
                "controllerManager": {
                    "replicas": 2,
                    "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
                    **SYSTEM_PLACEMENT,
                },
            },
            # The job CRDs must exist before Kueue starts watching them; on destroy Kueue stays
            # until the queues and workloads (and their finalizers) are gone.
            cluster.in_cluster(self, *job_operators, *cluster.controller_prerequisites),
        )
        platform_namespace(
            name, NAMESPACE, cluster, self, [self.release], [WEBHOOK_PORT, VISIBILITY_PORT]
        )
        self.register_outputs({})
