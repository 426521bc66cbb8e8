"""Revisions: stack jobs and the pools' runtimes run what they were deployed with until their
revision goes up.

A change to the containers of a running job's pods restarts it: Kueue (KUEUE_CHART) re-creates the
Workload of a job whose pod sets no longer match it (pkg/controller/jobframework/reconciler.go
ensureOneWorkload, stopJob), and computes a TrainJob's pod sets from its live runtime
(infra/operators/tests/trainer_rules.py). So a job, and a runtime, keeps the manifest it was
deployed with, image included, until its revision goes up. The manifests live in this stack's own
outputs, read back through a StackReference to the stack itself (the outputs of its last completed
update: pulumi/pulumi pkg/resource/deploy/builtins.go readStackReference).
"""

import copy

import pulumi

from infra.core.declared import dig, pod_sets


def deployed_outputs(*names: str) -> dict[str, pulumi.Output[dict]]:
    """{output: {name: {revision, manifest, ...}}} as this stack's last completed update exported
    them, for each of `names`."""
    stack = f"{pulumi.get_organization()}/{pulumi.get_project()}/{pulumi.get_stack()}"
    reference = pulumi.StackReference("deployed", stack_name=stack)
    return {name: reference.get_output(name).apply(lambda found: found or {}) for name in names}


def kept_manifest(
    entry: dict | None, revision: int, kind: str, namespace: str | None = None
) -> dict | None:
    """The manifest deployed as `entry` ({revision, manifest}), when this update must keep it:
    same revision, kind and namespace (one moved to another namespace or kind is a new object)."""
    if not entry or entry.get("revision") != revision:
        return None
    manifest = entry.get("manifest") or {}
    same_place = manifest.get("kind") == kind and (
        (manifest.get("metadata") or {}).get("namespace") == namespace
    )
    return manifest if same_place else None


def held_back(kept: dict | None, current: dict) -> list[str]:
    """The parts of the current manifest its kept one lacks: its image, its command and
    arguments (the trainer's, or its own program's), the rest of its pods and spec."""
    if kept is None or kept == current:
        return []
    changed = []
    kept_runs, current_runs = _runs(kept), _runs(current)
    for part, key in (("image", 1), ("command and arguments", 2)):
        if [run[0].get(run[key]) for run in kept_runs] != [
            run[0].get(run[key]) for run in current_runs
        ]:
            changed.append(part)
    if _without_runs(kept) != _without_runs(current):
        changed.append("pods and spec")
    return changed or ["pods and spec"]


def _runs(manifest: dict) -> list[tuple[dict, str, str]]:
    """(where, its image key, its command key) for what runs the trainer: every container and
    init container of the manifest's pods; a TrainJob's own trainer (image, and args, or a
    program's command)."""
    if manifest.get("kind") == "TrainJob":
        trainer = dig(manifest, "spec", "trainer")
        if not trainer:
            return []
        return [(trainer, "image", "command" if "command" in trainer else "args")]
    return [
        (container, "image", "command")
        for _, template in pod_sets(manifest.get("kind", ""), manifest).values()
        for kind in ("initContainers", "containers")
        for container in (template.get("spec") or {}).get(kind, [])
    ]


def _without_runs(manifest: dict) -> dict:
    stripped = copy.deepcopy(manifest)
    for where, image, command in _runs(stripped):
        where.pop(image, None)
        where.pop(command, None)
    return stripped
