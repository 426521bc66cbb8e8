"""The job kinds a team's members submit, as the local Kubernetes API (tests.kube_api) serves
them: the upstream PyTorchJob and MPIJob CRDs of tests/crds, a stand-in for TrainJob, Kueue's
Workload (infra.kueue.tests.kueue_rules), and an example job of examples/ filled in."""

from pathlib import Path

import yaml

from infra.core.tests.crd_schema import CRD_DIR
from infra.kueue.tests.kueue_rules import workload_crd
from tests.plugin import ROOT

EXAMPLE = ROOT / "examples" / "pytorchjob.yaml"


def _upstream(path: str) -> dict:
    return yaml.safe_load((CRD_DIR / path).read_text())


def trainjob_crd() -> dict:
    """TrainJob as kubeflow/trainer v2.3.0 declares it (pkg/apis/trainer/v1alpha1/
    trainjob_types.go: names, namespaced, status subresource) with a schema that keeps every
    field: these tests need TrainJobs stored and listed, not Trainer's schema enforced."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "trainjobs.trainer.kubeflow.org"},
        "spec": {
            "group": "trainer.kubeflow.org",
            "names": {
                "kind": "TrainJob",
                "listKind": "TrainJobList",
                "plural": "trainjobs",
                "singular": "trainjob",
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def job_crds() -> list[dict]:
    return [
        _upstream("training-operator/kubeflow.org_pytorchjobs.yaml"),
        _upstream("mpi-operator/kubeflow.org_mpijobs.yaml"),
        trainjob_crd(),
        workload_crd(),
    ]


def example_job(queue: str, image: str, path: Path = EXAMPLE) -> dict:
    """An example of examples/ with its placeholders filled in, as the docs' sed does."""
    text = path.read_text().replace("TEAM_QUEUE", queue).replace("TRAINER_IMAGE", image)
    return yaml.safe_load(text)
