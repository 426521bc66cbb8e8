"""Kubeflow job operators: PyTorchJob (training operator v1) and MPIJob (MPI operator v2beta1).

Both projects ship an MPIJob CRD under the same name; the training operator's copy and its MPIJob
controller are switched off (infra/manifests/training-operator/kustomization.yaml), so exactly one
MPIJob CRD, kubeflow.org/v2beta1, is installed and one controller serves it. Both are upstream
kustomize overlays at pinned tags, placed on the system nodes by infra/manifests/system-nodes.
"""

import pulumi
import pulumi_kubernetes as k8s

from infra.components.context import ClusterContext
from infra.paths import PROGRAM_DIR, provider_path

MANIFESTS = PROGRAM_DIR / "manifests"
MPI_OPERATOR_KUSTOMIZATION = MANIFESTS / "mpi-operator"
TRAINING_OPERATOR_KUSTOMIZATION = MANIFESTS / "training-operator"


class TrainingOperators(pulumi.ComponentResource):
    installs: list[pulumi.Resource]

    def __init__(
        self,
        name: str,
        cluster: ClusterContext,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:TrainingOperators", name, None, opts)
        child = pulumi.ResourceOptions(
            parent=self, provider=cluster.provider, depends_on=cluster.controller_prerequisites
        )
        mpi_operator = k8s.kustomize.v2.Directory(
            "mpi-operator", directory=provider_path(MPI_OPERATOR_KUSTOMIZATION), opts=child
        )
        training_operator = k8s.kustomize.v2.Directory(
            "training-operator",
            directory=provider_path(TRAINING_OPERATOR_KUSTOMIZATION),
            # The MPIJob CRD comes from the MPI operator; install it first.
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[mpi_operator])
            ),
        )
        self.installs = [mpi_operator, training_operator]
        self.register_outputs({})
