"""What a change does to the stack's jobs and the TrainJobs on its runtimes: restarted by Kueue,
created again (from their newest checkpoint, or from step 0 when their store moved), held at
their revision, kept on drifted nodes until rolled."""

import json
import re

from infra.core.change import CREATE, DELETE, REPLACE
from infra.core.day_two import Change, existing
from infra.core.declared import dig, listed
from infra.images.container_image import KEPT_BUILDS as ECR_KEPT_BUILDS
from infra.kueue.day_two import kueue_restarts
from infra.operators.facts import JOB_TYPES, RUNTIME
from infra.storage.day_two import deleted_claims, mounts_deleted
from workloads.manifests import CHECKPOINT_ENV


def jobs(change: Change) -> None:
    found = change.found
    for step, name in existing(change.steps, JOB_TYPES):
        if step.op == DELETE:
            found.restarts.append(f"job {name} is deleted: its pods are killed (checkpoints stay)")
        elif step.op == REPLACE:
            found.restarts.append(
                f"job {name} is deleted and created again ({', '.join(step.reasons[:2])}): "
                f"{_resumes(step)}"
            )
        else:
            restarting = kueue_restarts(step)
            if restarting:
                found.restarts.append(
                    f"job {name} restarts ({', '.join(restarting)}): Kueue suspends it, queues it "
                    f"again and {_resumes(step)}"
                )
            else:
                found.restarts.append(
                    f"job {name}: its change reaches its pods only when they next start"
                )
    for job in change.jobs:
        if job.node_pool in change.drifted:
            found.restarts.append(
                f"job {job.name} keeps its {job.node_pool} nodes while it runs (do-not-disrupt, "
                f"no terminationGracePeriod); to move it now, restarting it once: "
                f".venv/bin/python -m deploy.roll --stack {change.stack} --pool {job.node_pool}"
            )


def kinds(change: Change) -> None:
    """A job whose kind changes is a new object beside the running one (the kind is part of its
    resource's identity): Pulumi creates it first and deletes the old one at the update's end, so
    both run, writing the same checkpoints, for as long as the update takes."""
    by_place: dict[tuple[str, str], dict[str, str]] = {}
    for step in change.steps:
        if step.type in JOB_TYPES and step.op in (CREATE, DELETE):
            metadata = (step.new or step.old).inputs.get("metadata") or {}
            place = (str(metadata.get("namespace")), str(metadata.get("name")))
            by_place.setdefault(place, {})[step.op] = step.type.rsplit(":", 1)[-1]
    for (namespace, name), ops in sorted(by_place.items()):
        if {CREATE, DELETE} <= ops.keys():
            change.found.refusals.append(
                f"job-kind: job {name} in {namespace} changes kind {ops[DELETE]} -> "
                f"{ops[CREATE]} (a job without `kind` is a TrainJob): the new object starts "
                "beside the running one, and both write its checkpoints until the update ends; "
                f"allowed: kind {ops[DELETE]} (PyTorchJob: elastic jobs only), or remove the "
                "job in one update and add it back in the next (it resumes from its newest "
                "checkpoint when its store stays)"
            )


def _resumes(step) -> str:
    """Where a restarted job carries on: from its newest checkpoint, or from step 0 when its
    checkpoint folder moved (the trainer looks for checkpoints in its new folder only)."""
    old, new = _checkpoints(step.old), _checkpoints(step.new)
    if old == new:
        return "it resumes from its newest checkpoint"
    return (
        f"it starts again from step 0 at {new[1]} in {new[0]}: its checkpoints stay at {old[1]} "
        f"in {old[0]} (copy its newest step-* folder there first to carry on from it)"
    )


def _checkpoints(job) -> tuple[str, str]:
    """(namespace, checkpoint folder) of a job: its trainer's --checkpoint-dir, or a TrainJob's
    CHECKPOINT_DIR, else its runtime's default (S3, under the namespace); a shared file system's
    path is its namespace's own."""
    spec = job.inputs.get("spec") or {}
    found = re.search(r'"--checkpoint-dir", "([^"]+)"', json.dumps(spec))
    env = {e.get("name"): e.get("value") for e in listed(dig(spec, "trainer", "env"))}
    folder = found.group(1) if found else env.get(CHECKPOINT_ENV, "its runtime's default")
    return str(dig(job.inputs, "metadata", "namespace")), str(folder)


def runtimes(change: Change) -> None:
    """The pools' ClusterTrainingRuntimes: their TrainJobs are not in the stack, so the plan
    names what a change does to whichever run on them."""
    found = change.found
    for step, name in existing(change.steps, {RUNTIME}):
        if step.op == DELETE:
            found.restarts.append(
                f"runtime {name} is deleted: TrainJobs that name it can no longer start "
                "(running ones run on until they stop)"
            )
            continue
        restarting = kueue_restarts(step)
        if restarting:
            found.restarts.append(
                f"runtime {name} changes ({', '.join(restarting)}): each TrainJob running on it "
                "that does not set these itself restarts (Kueue suspends it, queues it again and "
                "it resumes from its newest checkpoint)"
            )
        else:
            found.restarts.append(
                f"runtime {name}: its change reaches the TrainJobs on it when they next start"
            )


def held_revisions(change: Change) -> None:
    """What a job or runtime keeps at its revision: the stack's changes wait for the next one, and
    a deletion of what its pods mount cannot wait with them."""
    found = change.found
    held = [
        ("job", name, entry, f"jobs[{name}]", "it") for name, entry in change.job_outputs.items()
    ]
    held += [
        ("runtime", name, entry, "runtimes", "the TrainJobs running on it")
        for name, entry in change.runtime_outputs.items()
    ]
    deleted = deleted_claims(change.steps)
    for what, name, entry, key, restarted in sorted(held, key=lambda h: h[:2]):
        if entry.get("heldBack"):
            found.restarts.append(
                f"{what} {name} keeps revision {entry['revision']}: the stack's changes to its "
                f"{', '.join(entry['heldBack'])} wait for {key}.revision "
                f"{entry['revision'] + 1}, which restarts {restarted}"
            )
            gone = mounts_deleted(entry.get("manifest") or {}, what, deleted)
            if gone:
                found.refusals.append(
                    f"held-revision: {what} {name} keeps revision {entry['revision']}, whose "
                    f"pods mount {', '.join(gone)}, which this update deletes: the deletion "
                    f"waits for its pods, and none could start again; move {key}.revision to "
                    f"{entry['revision'] + 1} in this update"
                )
    if any(entry.get("heldBack") for *_, entry, _, _ in held):
        found.notes.append(
            f"what keeps an older revision pulls an older image, which ECR keeps while fewer "
            f"than {ECR_KEPT_BUILDS} newer builds exist: bump the revision before then"
        )
