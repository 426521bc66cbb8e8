"""The job operators (infra/operators): Kubeflow's training operator, the MPI operator and
Trainer v2 with JobSet, applied as kustomize overlays of their upstream manifests.
"""

from infra.core.facts import Integration
from infra.operators import facts

# The packages of infra this one may import, besides itself (tests/e2e/test_layers.py).
INPUTS = ("core",)
OPERATORS = Integration("operators", kinds=facts.KINDS, overlays=facts.OVERLAYS)
