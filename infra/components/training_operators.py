"""Kubeflow job operators: PyTorchJob (training operator v1) and MPIJob (MPI operator v2beta1).

Both projects ship an MPIJob CRD under the same name; the training operator's copy and its MPIJob
controller are switched off (infra/manifests/training-operator/kustomization.yaml), so exactly one
MPIJob CRD, kubeflow.org/v2beta1, is installed and one controller serves it.
"""

from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from infra.versions import MPI_OPERATOR_MANIFEST

# Relative to the project root, where `pulumi up` runs the program.
TRAINING_OPERATOR_KUSTOMIZATION = Path("infra/manifests/training-operator")


class TrainingOperators(pulumi.ComponentResource):
    installs: list[pulumi.Resource]

    def __init__(
        self, name: str, provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("training-platform:infra:TrainingOperators", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        mpi_operator = k8s.yaml.v2.ConfigFile(
            "mpi-operator", file=MPI_OPERATOR_MANIFEST, opts=child
        )
        training_operator = k8s.kustomize.v2.Directory(
            "training-operator",
            directory=str(TRAINING_OPERATOR_KUSTOMIZATION),
            # The MPIJob CRD comes from the MPI operator; install it first.
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[mpi_operator])
            ),
        )
        self.installs = [mpi_operator, training_operator]
        self.register_outputs({})
