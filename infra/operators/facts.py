"""What the platform knows about the job operators' kinds (their jobs' pods run on the pools, the
expected cost prices them) and the Deployments of the overlays that install the operators."""

from infra.core.facts import K8S, K8S_OBJECT, ImmutableRule, Kind, ReplaceRule
from infra.core.pods import OverlayPods, Requests

PYTORCHJOB = "kubernetes:kubeflow.org/v1:PyTorchJob"
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
TRAINJOB = "kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob"
JOB_TYPES = {PYTORCHJOB, MPIJOB, TRAINJOB}
RUNTIME = "kubernetes:trainer.kubeflow.org/v1alpha1:ClusterTrainingRuntime"


KINDS = (
    Kind(
        PYTORCHJOB,
        free=f"{K8S_OBJECT}; its pods run on the pools (expected)",
        immutable=ImmutableRule(
            ("spec.runPolicy.schedulingPolicy.queue",),
            "training-operator v1.9.4 CRD kubeflow.org_pytorchjobs.yaml: self == oldSelf",
            "give the job a new revision (a new object)",
        ),
    ),
    Kind(
        MPIJOB,
        free=f"{K8S_OBJECT}; its pods run on the pools (expected)",
    ),
    # Not the provider's: the program's replace_on_changes (workloads/training_job.py),
    # because the Trainer v2.3 TrainJob CRD makes spec.trainer and spec.runtimeRef immutable.
    Kind(
        TRAINJOB,
        free=f"{K8S_OBJECT}; its pods run on the pools (expected)",
        replace=ReplaceRule(("spec",), K8S),
    ),
    Kind(
        RUNTIME,
        free=f"{K8S_OBJECT}; the pods of "
        "TrainJobs the teams submit run on its pool, within the pool's ceiling",
        immutable=ImmutableRule(
            tuple(
                f"spec.template.spec.{field}"
                for field in (
                    "failurePolicy",
                    "network",
                    "startupPolicy",
                    "successPolicy",
                    "volumeClaimPolicies",
                    "replicatedJobs.[].dependsOn",
                )
            ),
            "Trainer v2.3.0 CRD trainer.kubeflow.org_clustertrainingruntimes.yaml: self == oldSelf",
            "remove the runtime in one `pulumi up` (no TrainJob may use it meanwhile) and add it "
            "back in the next",
        ),
    ),
)


# The overlays in deploy/manifests: their Deployments go to the system nodes (its system-nodes
# component), with the requests upstream sets.
OVERLAYS = {
    "manifests/trainer": [
        OverlayPods(
            "trainer-controller-manager",
            "kubeflow/trainer v2.3.0 manifests/base/manager/manager.yaml: none",
        ),
        # v0.12.0 through the trainer's manifests/third-party/jobset; the requests are unchanged
        # from v0.9.1 to main at 08dfbdfd (2026-08-18).
        OverlayPods(
            "jobset-controller-manager",
            "kubernetes-sigs/jobset v0.12.0 config/components/manager/manager.yaml: 500m CPU, "
            "128Mi",
            Requests(cpu=0.5, memory_mib=128),
        ),
    ],
    "manifests/training-operator": [
        OverlayPods(
            "training-operator", "kubeflow/trainer v1.9.4 manifests/base/deployment.yaml: none"
        )
    ],
    "manifests/mpi-operator": [
        OverlayPods(
            "mpi-operator",
            "kubeflow/mpi-operator v0.8.0 deploy/v2beta1/mpi-operator.yaml: none",
        )
    ],
}
