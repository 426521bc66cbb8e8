"""Which changes to a running job Kueue restarts it for. Kueue (read at v0.19.2; for v0.20.7 at
main ff69552e, the newest readable commit, where reconciler.go and pkg/util/equality are the same
in these rules; tests/crds/SOURCES.md) restarts a running job
whose pod sets no longer match its Workload: counts and containers (image, command, args, env,
resources), init containers (pkg/util/equality/podset.go comparePodTemplate); other pod fields
reach only the job's next start (pkg/controller/jobframework/reconciler.go EquivalentToWorkload).
It computes a TrainJob's pod sets from its live ClusterTrainingRuntime, so a runtime's container
change restarts the running TrainJobs on it (infra/operators/tests/trainer_rules.py)."""

from infra.core.change import Step
from infra.core.declared import dig, kind_of, pod_sets
from infra.core.replacement import changed_paths


def kueue_restarts(step: Step) -> list[str]:
    """What of a job's (or runtime's) pod sets changed in a way Kueue restarts it for."""
    kind = kind_of(step.type)
    before, after = pod_sets(kind, step.old.inputs), pod_sets(kind, step.new.inputs)
    changed = []
    for role in sorted(set(before) | set(after)):
        (old_pods, old), (new_pods, new) = before.get(role, (0, {})), after.get(role, (0, {}))
        if old_pods != new_pods:
            changed.append(f"{role} replicas")
        for what in ("initContainers", "containers"):
            paths = changed_paths(dig(old, "spec", what) or [], dig(new, "spec", what) or [])
            fields = sorted({p.split(".", 1)[-1].split("[")[0] for p in paths} - {""})
            if paths:
                changed.append(f"{role} {what} {', '.join(fields) or 'list'}")
    return changed
