"""What a `pulumi up` would do to each resource, going from one plan of a stack to the next.

Offline, from two plans: a resource only in the old plan is deleted, only in the new one created;
in both, it is replaced when a changed input forces it (infra/core/replacement.py) and updated
otherwise. A replacement carries over: a resource whose replace-forcing inputs hold a replaced
resource's id or outputs (an FSx association's fileSystemId) is replaced too, and so is every
resource of a replaced provider (pulumi-kubernetes replaces its provider when the cluster's
kubeconfig becomes unknown, and the engine replaces every resource of a replaced provider:
pulumi/pulumi pkg/resource/deploy/step_generator.go, providerChanged).

From a real `pulumi preview --json`: the engine's own steps (pkg/display/json.go PreviewDigest;
op values in pkg/resource/deploy/step.go StepOps).
"""

import copy
import json
from typing import Any

from infra.core.change import CREATE, DELETE, REPLACE, UPDATE, Step
from infra.core.facts import Facts
from infra.core.offline import Plan, RecordedResource
from infra.core.replacement import changed_paths, replacing_paths

PROVIDER_PREFIX = "pulumi:providers:"


def _managed(resource: RecordedResource, facts: Facts) -> bool:
    """A resource of the provider's own, or a component that stands for one offline
    (`Kind.stands_in`)."""
    kind = facts.kind(resource.type)
    return resource.custom or bool(kind and kind.stands_in)


def _kept_ignored(old: dict, new: dict, paths: list[str]) -> dict:
    """`new` with the deployed value at each ignored path, as the engine applies it (Pulumi:
    ignoreChanges uses the old value of those properties)."""
    if not paths:
        return new
    kept = copy.deepcopy(new)
    for path in paths:
        *parents, leaf = path.split(".")
        source, target = old, kept
        for key in parents:
            source = source.get(key, {}) if isinstance(source, dict) else {}
            target = target.setdefault(key, {}) if isinstance(target, dict) else {}
        if isinstance(source, dict) and leaf in source and isinstance(target, dict):
            target[leaf] = copy.deepcopy(source[leaf])
    return kept


def plan_steps(old: Plan, new: Plan, facts: Facts) -> list[Step]:
    """Every resource's step from `old` to `new` (unchanged resources have none)."""
    before = {r.urn: r for r in old.resources if _managed(r, facts)}
    after = {r.urn: r for r in new.resources if _managed(r, facts)}
    steps: dict[str, Step] = {}
    for urn, resource in before.items():
        if urn not in after:
            steps[urn] = Step(DELETE, urn, resource.type, resource, None)
    for urn, resource in after.items():
        if urn not in before:
            steps[urn] = Step(CREATE, urn, resource.type, None, resource)
            continue
        previous = before[urn]
        inputs = _kept_ignored(previous.inputs, resource.inputs, resource.ignore_changes)
        replacing = replacing_paths(resource.type, previous.inputs, inputs, facts)
        changed = changed_paths(previous.inputs, inputs)
        if replacing:
            steps[urn] = Step(REPLACE, urn, resource.type, previous, resource, replacing)
        elif changed:
            steps[urn] = Step(UPDATE, urn, resource.type, previous, resource, changed)
    if old.region and new.region and old.region != new.region:
        # Every AWS resource's provider is configured with the region: another region is another
        # provider, whose resources are all new (the engine's providerChanged).
        for urn, resource in after.items():
            if urn in before and resource.type.startswith(("aws:", "eks:")):
                reason = f"aws:region {old.region} -> {new.region}"
                steps[urn] = Step(REPLACE, urn, resource.type, before[urn], resource, [reason])
    _carry_replacements(before, after, steps, facts)
    return sorted(steps.values(), key=lambda s: s.urn)


def _carry_replacements(
    before: dict[str, RecordedResource],
    after: dict[str, RecordedResource],
    steps: dict,
    facts: Facts,
) -> None:
    """Replace what a replacement takes with it, until nothing more changes."""
    pending = [s.urn for s in steps.values() if s.op == REPLACE]
    while pending:
        replaced = before[pending.pop()]
        marks = {v for v in replaced.outputs.values() if len(v) > 4} | {replaced.urn}
        for urn, resource in after.items():
            if urn not in before or (urn in steps and steps[urn].op == REPLACE):
                continue
            reasons = _taken_along(replaced, before[urn], resource, marks, facts)
            if reasons:
                steps[urn] = Step(REPLACE, urn, resource.type, before[urn], resource, reasons)
                pending.append(urn)


def _taken_along(
    replaced: RecordedResource,
    old: RecordedResource,
    new: RecordedResource,
    marks: set[str],
    facts: Facts,
) -> list[str]:
    provider = new.provider.split("::")[-1] if new.provider else ""
    if replaced.type.startswith(PROVIDER_PREFIX) and new.provider.startswith(replaced.urn):
        return [f"provider {provider} replaced"]
    if new.type.startswith(PROVIDER_PREFIX) and replaced.urn in new.dependencies:
        # Its configuration (a kubeconfig) comes from the replaced resource: unknown in a preview.
        return [f"configuration from {replaced.name}"]
    if replaced.urn not in new.dependencies:
        return []
    # The inputs that hold the replaced resource's identity will change: do they force it?
    holding = _paths_holding(old.inputs, marks)
    if not holding:
        return []
    stand_in = json.loads(json.dumps(old.inputs))
    for path in holding:
        _set(stand_in, path, f"<new {replaced.name}>")
    return [
        f"{path} (from {replaced.name})"
        for path in replacing_paths(new.type, old.inputs, stand_in, facts)
    ]


def _paths_holding(value: Any, marks: set[str], prefix: str = "") -> list[str]:
    if isinstance(value, dict):
        return [
            p
            for k, v in value.items()
            for p in _paths_holding(v, marks, f"{prefix}.{k}" if prefix else k)
        ]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _paths_holding(v, marks, f"{prefix}[{i}]")]
    if isinstance(value, str) and any(mark in value for mark in marks):
        return [prefix]
    return []


def _set(root: Any, path: str, value: Any) -> None:
    parts = []
    for part in path.split("."):
        name, *indices = part.replace("]", "").split("[")
        parts.append(name)
        parts += [int(i) for i in indices]
    node = root
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value


# The ops of `pulumi preview --json` that lose the old resource.
PREVIEW_OPS = {
    "create": CREATE,
    "update": UPDATE,
    "replace": REPLACE,
    "create-replacement": REPLACE,
    "delete-replaced": REPLACE,
    "delete": DELETE,
}


def preview_steps(preview: dict, facts: Facts) -> list[Step]:
    """The steps of a real preview (`pulumi preview --json`), in this module's terms."""
    steps: dict[str, Step] = {}
    for raw in preview.get("steps") or []:
        op = PREVIEW_OPS.get(raw.get("op"))
        if op is None:
            continue
        old, new = _state(raw.get("oldState")), _state(raw.get("newState"))
        resource = new or old
        if resource is None or not _managed(resource, facts):
            continue
        reasons = list(raw.get("replaceReasons") or raw.get("diffReasons") or [])
        if raw["urn"] in steps and steps[raw["urn"]].op == REPLACE:
            continue  # the replacement's other half
        steps[raw["urn"]] = Step(op, raw["urn"], resource.type, old, new, reasons)
    return sorted(steps.values(), key=lambda s: s.urn)


def _state(state: dict | None) -> RecordedResource | None:
    if not state:
        return None
    return RecordedResource(
        urn=state["urn"],
        type=state["type"],
        name=state["urn"].rsplit("::", 1)[-1],
        parent=state.get("parent", ""),
        provider=state.get("provider", ""),
        dependencies=list(state.get("dependencies") or []),
        inputs=dict(state.get("inputs") or {}),
        custom=bool(state.get("custom", True)),
        protect=bool(state.get("protect", False)),
    )
