"""What a change does to what already runs, as the plan and the pull-request gate word it for the
platform engineer about to apply it: the data it loses, what it replaces, the nodes it drifts, the
work it restarts.

Each integration words what a change to its own kinds does (`Integration.day_two`, in its
day_two.py, with the upstream rules it rests on); this module holds what they share: the change
they read (the steps, and what of the stack file they need), the consequences they add to, and the
data check every holder goes through.

Data holders (infra/core/data_holders.py) are protected. The engine replaces a protected resource
only when the program no longer protects it, and deletes one only when its deployed state is no
longer protected (pulumi/pulumi pkg/resource/deploy/step_generator.go `new.Protect &&
old.Protect`; step.go DeleteStep.Apply `s.old.Protect`): a deletion takes one `pulumi up` with the
acknowledgement, then one that removes the holder.
"""

import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from infra.core.change import CREATE, DELETE, REPLACE, UPDATE, Change, Consequences, Step
from infra.core.data_holders import HOLDER_ANNOTATION, HOLDER_TAG
from infra.core.declared import dig
from infra.core.replacement import changed_paths

if TYPE_CHECKING:
    from infra.core.facts import Facts

ACKNOWLEDGE = "training-platform:acknowledgeDataLoss"


Check = Callable[[Change], None]


def holder_of(resource) -> str | None:
    """The data holder a resource is (its tag or annotation), or None."""
    if resource is None:
        return None
    inputs = resource.inputs
    for tags in (inputs.get("tags"), inputs.get("clusterTags")):
        if isinstance(tags, dict) and tags.get(HOLDER_TAG):
            return str(tags[HOLDER_TAG])
    annotation = dig(inputs, "metadata", "annotations", HOLDER_ANNOTATION)
    return str(annotation) if annotation else None


def accepting(holder: str) -> str:
    return f"to accept it, add {{holder: {holder}, reason: ...}} to {ACKNOWLEDGE}"


def existing(steps: list[Step], types: set[str]) -> Iterator[tuple[Step, object]]:
    """(step, Kubernetes name) of each object of `types` that exists and changes or goes."""
    for step in steps:
        if step.type in types and step.op != CREATE:
            yield step, dig((step.new or step.old).inputs, "metadata", "name")


def data_losses(change: Change) -> None:
    """Every holder a change replaces or deletes, refused unless the stack file accepts it, and
    the rest it replaces or deletes, grouped by cause."""
    found, released = change.found, change.released
    lost = set()
    others: dict[str, list[str]] = {}
    for step in change.steps:
        if step.op not in (REPLACE, DELETE):
            continue
        holder = holder_of(step.old)
        if holder is None:
            cause = f"replaced ({step.reasons[0]})" if step.op == REPLACE else "deleted"
            others.setdefault(cause, []).append(f"{step.type.split(':')[-1]} {step.name}")
            continue
        lost.add(holder)
        what = "replaced" if step.op == REPLACE else "deleted"
        why = f" ({', '.join(step.reasons[:3])})" if step.reasons else ""
        line = f"{step.type.split(':')[-1]} {step.name} is {what}{why}: loses {change.loss(holder)}"
        found.losses.append(line)
        if holder not in released:
            found.refusals.append(
                f"data-loss: {step.name} ({holder}) would be {what}, losing {change.loss(holder)}; "
                f"{accepting(holder)}"
            )
        elif step.op == DELETE and step.old.protect:
            found.refusals.append(
                f"data-loss: {step.name} ({holder}) is protected where it is deployed: the engine "
                "deletes it only once a `pulumi up` has lifted its protect. First apply the stack "
                f"with the acknowledgement and {holder} still in it, then remove it (or `pulumi "
                f"state unprotect '{step.urn}'`)"
            )
    for cause, names in sorted(others.items(), key=lambda item: -len(item[1])):
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        found.replaced.append(f"{cause}: {shown}")
    for holder in sorted(released - lost):
        found.notes.append(
            f"{ACKNOWLEDGE} lifts protect from {holder}, which this change does not lose; once "
            "the change that loses it is applied, remove the entry"
        )


def _item_path(path: str) -> str:
    """`spec.a[3].b` -> `spec.a.[].b`: a changed path in a rule's notation."""
    return re.sub(r"\[\d+\]", ".[]", path)


def _touches(changed: str, path: str) -> bool:
    return changed == path or changed.startswith(path + ".") or path.startswith(changed + ".")


def _present(inputs: dict, path: str) -> bool:
    """Whether `path` holds a value, as CEL's has() sees it (the API server drops nulls)."""
    return dig(inputs, *path.split(".")) is not None


def immutable_fields(change: Change, facts: "Facts") -> None:
    """Every update of a field the API server keeps as it was created (Kind.immutable), refused
    with the way through."""
    for step in change.steps:
        kind = facts.kind(step.type)
        rule = kind.immutable if kind else None
        if rule is None or step.op != UPDATE:
            continue
        old, new = step.old.inputs, step.new.inputs
        if rule.when and not _present(old, rule.when):
            continue
        changed = [_item_path(p) for p in changed_paths(old, new)]
        hit = sorted(
            {path for path in rule.paths if any(_touches(c, path) for c in changed)}
            | {path for path in rule.presence if _present(old, path) != _present(new, path)}
        )
        if hit:
            change.found.refusals.append(
                f"immutable: {step.type.split(':')[-1]} {step.name}: {', '.join(hit)} cannot "
                f"change once it exists ({rule.source}): the API server would refuse the update "
                f"half-way through `pulumi up`; {rule.way}"
            )


def consequences(change: Change, facts: "Facts", checks: tuple[Check, ...] = ()) -> Consequences:
    """Every integration's checks in their order, then `checks` (of what builds on them)."""
    immutable_fields(change, facts)
    for integration in facts.integrations:
        for check in integration.day_two:
            check(change)
    for check in checks:
        check(change)
    return change.found
