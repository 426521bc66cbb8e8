"""A declared resource's inputs, read alike from the offline plan and in a real preview.

The plan records plain dicts; the policy pack meets pulumi_policy's read-only proxies (Mappings and
Sequences). A program edit can drop any field, so every read here tolerates a missing one.
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.core.offline import Plan

# Kubernetes quantity suffixes (resource.Quantity): binary and decimal.
QUANTITY_UNITS = {
    **{s: 1024**i for i, s in enumerate(("", "Ki", "Mi", "Gi", "Ti", "Pi"))},
    **{s: 1000**i for i, s in enumerate(("k", "M", "G", "T", "P"), start=1)},
}


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


def quantity(value: object) -> float:
    """A Kubernetes quantity ("200Gi", "4", 4, "500m") as a number."""
    text = str(value)
    if text.endswith("m") and re.fullmatch(r"[0-9]+m", text):
        return int(text[:-1]) / 1000
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)", text)
    if not match or match[2] not in QUANTITY_UNITS:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    return float(match[1]) * QUANTITY_UNITS[match[2]]


# Where each training kind holds its pods: the replica specs of the Kubeflow v1 and MPI jobs, the
# replicated jobs of a Trainer v2 runtime. A TrainJob has none of its own: its pods are its
# runtime's, patched by its spec.
REPLICA_SPEC_KEYS = {"PyTorchJob": "pytorchReplicaSpecs", "MPIJob": "mpiReplicaSpecs"}
RUNTIME_KIND = "ClusterTrainingRuntime"


def kind_of(type_token: str) -> str:
    """The Kubernetes kind of a Pulumi type token (kubernetes:<group>/<version>:<Kind>)."""
    return type_token.rsplit(":", 1)[-1]


def pod_sets(kind: str, props: Mapping) -> dict[str, tuple[int, Mapping]]:
    """role -> (pods, pod template) of a training object of `kind`; empty for other kinds."""
    if kind in REPLICA_SPEC_KEYS:
        specs = dig(props, "spec", REPLICA_SPEC_KEYS[kind]) or {}
        return {
            role: (int(dig(spec, "replicas") or 1), dig(spec, "template") or {})
            for role, spec in specs.items()
        }
    if kind == RUNTIME_KIND:
        return {
            str(dig(job, "name")): (
                int(dig(job, "replicas") or 1),
                dig(job, "template", "spec", "template") or {},
            )
            for job in listed(dig(props, "spec", "template", "spec", "replicatedJobs"))
        }
    return {}
