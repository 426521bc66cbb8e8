"""The walk over every stack-config key: each refuses a value AWS or Kubernetes would refuse.

Every leaf of the schema (StackConfig, walked through its models, so a key no stack file sets is
walked too) gets values far outside what any API takes: a number of a billion and -1, a string
of 300 characters, a list two hundred times as long. Each must be a config error naming the
key, unless ANY_VALUE_ALLOWED says why the value is harmless there. A new key without a limit
fails here until it gets one or a reason.
"""

import copy
import typing
from collections.abc import Iterator

from pydantic import BaseModel

from infra.core.config import ConfigError
from infra.hybrid.tests.test_hybrid import HYBRID, PRIVATE_ENDPOINT_OFF
from infra.stack.config import StackConfig
from infra.stack.loading import parse_stack_config
from tests.plugin import stack_values

SECTION = "training-platform:"
COUNTER = "a counter kept in the stack's outputs; no object's name or label holds it"
# Keys where those values go through, and why that is right (`[]`: any item of a list).
ANY_VALUE_ALLOWED = {
    "jobs[].args": "the trainer's own parser reads them (an argument repeated: the last wins), "
    "and the pod's args have no limit of their own below etcd's object size",
    "jobs[].command": "the user's own command, run as written",
    "jobs[].code.run": "the user's own command, run as written",
    "nodePools[].instanceTypes": "a type listed twice is the same requirement value to Karpenter "
    "(its NodePool requirement values have no item limit)",
    "storage.fsx.datasetPrefix": "an S3 prefix: FSx takes a data repository path of up to 4357 "
    "characters (CreateDataRepositoryAssociation), S3 a key of 1024 bytes",
    "policy.budgetUsdPerHour": "the cost-budget policy's threshold, no API's value (infinity "
    "and NaN are refused)",
    "jobs[].revision": COUNTER,
    "runtimes.revision": COUNTER,
}
# Lists no stack here fills, whose items' limits their own tests try key by key.
WALKED_ELSEWHERE = {
    "nodePools[].capacityReservations[]": "infra/karpenter/tests/test_capacity.py",
    "nodePools[].fabricCheck.floors[]": "workloads/tests/test_nccl_check.py",
    "acknowledgeDataLoss[]": "tests/e2e/test_day_two.py",
}


def _alias(model: type[BaseModel], name: str) -> str:
    info = model.model_fields[name]
    return info.alias or model.model_config["alias_generator"](name)


def _models(annotation) -> list[type[BaseModel]]:
    found = [a for arg in typing.get_args(annotation) for a in _models(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        found.append(annotation)
    return found


def _is_list(annotation) -> bool:
    return typing.get_origin(annotation) is list or any(
        _is_list(a)
        for a in typing.get_args(annotation)
        if typing.get_origin(a) is not typing.Literal
    )


def leaves(model: type[BaseModel], path: tuple = ()) -> Iterator[tuple]:
    """Paths of the schema's leaves: keys, with `[]` for an item of a list of models."""
    for name, info in model.model_fields.items():
        key = path + (_alias(model, name),)
        inner = _models(info.annotation)
        if inner:
            step = key + ("[]",) if _is_list(info.annotation) else key
            for sub in dict.fromkeys(inner):
                yield from leaves(sub, step)
        else:
            yield key, info.annotation


def _sections() -> Iterator[tuple[str, tuple, typing.Any]]:
    for name, info in StackConfig.model_fields.items():
        section = _alias(StackConfig, name)
        inner = _models(info.annotation)
        if not inner:
            yield section, (), info.annotation
            continue
        for sub in dict.fromkeys(inner):
            for leaf, annotation in leaves(sub, ("[]",) if _is_list(info.annotation) else ()):
                yield section, leaf, annotation


def _bases() -> list[dict]:
    hybrid = stack_values("dev", hybrid=HYBRID, cluster=PRIVATE_ENDPOINT_OFF)
    return [stack_values("dev"), stack_values("prod"), hybrid]


def _place(values: dict, section: str, path: tuple, value) -> bool:
    """`value` at `path` of `section` in `values` (the first item of each list); False when
    the stack has no such place (a list that is empty)."""
    key = SECTION + section if section != "region" else "aws:region"
    if not path:
        values[key] = value
        return True
    node = values.setdefault(key, {})
    for step, nxt in zip(path, path[1:], strict=False):
        if step == "[]":
            if not isinstance(node, list) or not node:
                return False
            node = node[0]
            continue
        if not isinstance(node, dict):
            return False
        node = node.setdefault(step, [] if nxt == "[]" else {})
    if not isinstance(node, dict):
        return False
    node[path[-1]] = value
    return True


def _current(values: dict, section: str, path: tuple):
    node = values.get(SECTION + section)
    for step in path:
        if step == "[]":
            node = node[0] if isinstance(node, list) and node else None
        else:
            node = node.get(step) if isinstance(node, dict) else None
    return node


def _types(annotation) -> set:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return {type(a) for a in args}
    return {annotation} | {t for a in args for t in _types(a)} if args else {annotation}


def _extremes(annotation, current) -> list:
    """Values far outside any API's range, of the types the key takes."""
    types = _types(annotation)
    if _is_list(annotation):
        item = current[0] if current else "A" * 300
        return [(current or [item]) * 200]
    values = []
    if types & {int, float, typing.Any}:
        values += [10**15, -1]
    if types & {str, typing.Any}:
        values.append("A" * 300)
    return values


def _walked() -> list[tuple[str, tuple, typing.Any]]:
    # Only true or false: nothing to exceed. The region: known_region checks it against the
    # price files (test_config).
    return [
        (s, p, a) for s, p, a in _sections() if s != "region" and _types(a) - {bool, type(None)}
    ]


def _name(section: str, path: tuple) -> str:
    return ".".join([section, *path]).replace(".[]", "[]")


def _refusals(section: str, path: tuple, annotation, bases: list[dict]) -> list[str]:
    """What is wrong with one key: extremes it accepts, or no stack to try it in."""
    name = _name(section, path)
    for base in bases:
        current = _current(base, section, path)
        tried, accepted = False, []
        for value in _extremes(annotation, current):
            values = copy.deepcopy(base)
            if not _place(values, section, path, value):
                continue
            tried = True
            try:
                parse_stack_config(values, "Pulumi.dev.yaml")
            except ConfigError as error:
                if f"{SECTION}{section}" not in str(error):
                    accepted.append(f"{name}: refused elsewhere: {str(error)[:200]}")
                continue
            if name not in ANY_VALUE_ALLOWED:
                accepted.append(f"{name} accepts {str(value)[:60]}")
        if tried:
            return accepted
    if any(name.startswith(items) for items in WALKED_ELSEWHERE):
        return []
    return [f"no stack here has a place for {name}"]


def test_every_key_refuses_what_no_api_takes():
    bases = _bases()
    problems = [p for s, path, a in _walked() for p in _refusals(s, path, a, bases)]
    assert not problems, "\n".join(problems)
    assert len(_walked()) > 100  # the walk reaches into the nested models


def test_every_reason_names_a_key_of_the_schema():
    names = {_name(s, p) for s, p, _ in _walked()}
    assert set(ANY_VALUE_ALLOWED) <= names
    assert all(any(n.startswith(items) for n in names) for items in WALKED_ELSEWHERE)
