"""Kubeflow job operators: PyTorchJob (training operator v1), MPIJob (MPI operator v2beta1) and
TrainJob (Kubeflow Trainer v2, on JobSet).

Both v1 projects ship an MPIJob CRD under the same name; the training operator's copy and its MPIJob
controller are switched off (training-operator/kustomization.yaml in the overlays' folder), so
exactly one MPIJob CRD, kubeflow.org/v2beta1, is installed and one controller serves it. Trainer v2
sits beside them: its own API group, namespace, webhooks and cluster roles
(infra/operators/tests/trainer_rules.py says where upstream defines each). All three are upstream
kustomize overlays at pinned tags, placed on the system nodes by the overlays' system-nodes
component. The overlays live beside the program (deploy/manifests), whose working directory the
kustomize provider resolves them from.
"""

from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext
from infra.core.network_policies import platform_namespace
from infra.core.paths import provider_path

# The namespaces the overlays install into, and the webhook ports the API server calls there:
# Trainer v2.3.0 and JobSet v0.12.0 (its manager overlay) on 9443 in kubeflow-system
# (manifests/base/manager/manager.yaml; jobset config/default/manager_webhook_patch.yaml), the
# training operator v1.9.4 on 9443 in kubeflow (manifests/base/deployment.yaml); the MPI operator
# v0.8.2 serves nothing (manifests/base/deployment.yaml: no Service, no webhook, metrics off).
WEBHOOK_PORT = 9443
NAMESPACES = {"kubeflow-system": [WEBHOOK_PORT], "kubeflow": [WEBHOOK_PORT], "mpi-operator": []}
# The overlays' folders in the folder the program hands over.
MPI_OPERATOR = "mpi-operator"
TRAINING_OPERATOR = "training-operator"
TRAINER = "trainer"


class TrainingOperators(pulumi.ComponentResource):
    installs: list[pulumi.Resource]
    trainer: pulumi.Resource  # Trainer v2: what TrainJobs and ClusterTrainingRuntimes need

    def __init__(
        self,
        name: str,
        cluster: ClusterContext,
        overlays: Path,  # the folder holding the MPI_OPERATOR, TRAINING_OPERATOR, TRAINER overlays
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:TrainingOperators", name, None, opts)
        child = cluster.in_cluster(self, *cluster.controller_prerequisites)
        mpi_operator = k8s.kustomize.v2.Directory(
            "mpi-operator", directory=provider_path(overlays / MPI_OPERATOR), opts=child
        )
        training_operator = k8s.kustomize.v2.Directory(
            "training-operator",
            directory=provider_path(overlays / TRAINING_OPERATOR),
            # The MPIJob CRD comes from the MPI operator; install it first.
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[mpi_operator])
            ),
        )
        self.trainer = k8s.kustomize.v2.Directory(
            "kubeflow-trainer", directory=provider_path(overlays / TRAINER), opts=child
        )
        self.installs = [mpi_operator, training_operator, self.trainer]
        for namespace, ports in NAMESPACES.items():
            platform_namespace(
                f"{name}-{namespace}", namespace, cluster, self, self.installs, ports
            )
        self.register_outputs({})
