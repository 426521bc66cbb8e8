"""A declared resource's inputs, read alike from the offline plan and in a real preview.

The plan records plain dicts; the policy pack meets pulumi_policy's read-only proxies (Mappings and
Sequences). A program edit can drop any field, so every read here tolerates a missing one.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.offline import Plan


@dataclass(frozen=True)
class Declared:
    """What the plan's tables and the policy pack's stack rules read of one resource."""

    urn: str
    type: str
    name: str
    props: Mapping[str, Any]
    dependencies: tuple[str, ...] = ()  # URNs


def declared_in(plan: Plan) -> list[Declared]:
    return [
        Declared(r.urn, r.type, r.name, r.inputs, tuple(r.dependencies)) for r in plan.resources
    ]


def dig(value: Any, *path: str | int) -> Any:
    """value[path...], None where a step is missing."""
    for step in path:
        if isinstance(value, Mapping):
            value = value.get(step)
        elif isinstance(value, Sequence) and isinstance(step, int) and step < len(value):
            value = value[step]
        else:
            return None
    return value


def listed(value: Any) -> list:
    """A list value as a list, a single value as a one-item list, nothing as []."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        return list(value)
    return [] if value is None else [value]
