"""The Kubeflow training operator v1 is finished upstream, and PyTorchJob with it: what the plan
and `devctl submit` say of every PyTorchJob, with the sources, checked 2026-11-29.

- v1.9.4 (2026-08-18) is the last release of its maintenance branch (kubeflow/trainer, branch
  release-1.9); a maintainer wrote the v1 project "has already been closed and will be completely
  removed" (kubeflow/trainer#3517).
- Kubeflow's own distribution removed it in July 2026 (kubeflow/community-distribution#3540).
- Kueue's `kubeflow.org/pytorchjob` integration is deprecated and off by default since 0.19
  (CHANGELOG-0.19: "Kubeflow training v1 will be deprecated in future releases"); its removal is
  proposed in kubernetes-sigs/kueue#12620 (open, 2026-11). infra/kueue/tests/test_kueue.py fails
  the suite the day the pinned Kueue no longer registers it.

PyTorchJob stays for what only it does here: elastic torchrun (Trainer v2.3 and v2.4 have no
elastic PyTorch, KEP-2903 open), and jobs on the hybrid machines, which have no runtime. The way
off it when Kueue drops the integration is written down in docs/users/jobs.md (Elastic jobs after
the training operator).
"""

from infra.core.versions import TRAINING_OPERATOR_VERSION

SOURCES = "kubeflow/trainer#3517, kubeflow/community-distribution#3540, kubernetes-sigs/kueue#12620"
WAY_OFF = "docs/users/jobs.md#elastic-jobs-after-the-training-operator"


def pytorchjob_warning(job: str, elastic: bool = True) -> str:
    """What the plan and `devctl submit` print for a PyTorchJob: elastic, or of a fixed size on
    the hybrid machines (which have no runtime for a TrainJob)."""
    what = "an elastic PyTorchJob" if elastic else "a PyTorchJob (no TrainJob runs there)"
    return (
        f"job {job} is {what}: it runs on the Kubeflow training operator "
        f"{TRAINING_OPERATOR_VERSION}, the last release of a project upstream no longer "
        "maintains, admitted by Kueue's kubeflow.org/pytorchjob integration, deprecated and "
        f"proposed for removal in a minor release ({SOURCES}); a fixed size runs as a TrainJob, "
        f"and the way off for elastic jobs is in {WAY_OFF}"
    )
