"""Every stack-config key of a stack, each with an edit that still validates: what the day-two
sweep (tests/e2e/test_day_two_edits.py) plans.

Keys are walked on the validated model, defaults included (a key the stack file leaves out is one
a platform engineer may still set). Each leaf gets the first candidate value, by its type, that
the config accepts; list items named by `name` are also removed one at a time and renamed.
"""

import copy
import ipaddress
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from infra.core.catalog import load_catalog
from infra.core.config import NAMESPACE, ConfigError
from infra.stack.loading import parse_stack_config

# A prebuilt image by digest, for the `uri` keys that otherwise build one.
PREBUILT_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/prebuilt/image@sha256:" + "0" * 64
# A principal, for lists of IAM ARNs the stack leaves empty (a team's members).
PRINCIPAL = "arn:aws:iam::123456789012:role/edited"


@dataclass(frozen=True)
class Edit:
    key: str  # the key path, list items by name (`devServers.users[carol].name`)
    change: Callable[[dict[str, Any]], dict[str, Any]]  # raw stack config -> edited copy

    def __call__(self, values: dict[str, Any]) -> dict[str, Any]:
        return self.change(values)


def _raw_key(section: str) -> str:
    return "aws:region" if section == "region" else f"{NAMESPACE}:{section}"


def leaves(model: BaseModel, path: tuple = ()) -> Iterator[tuple[tuple, Any, Any]]:
    """(path of aliases and list indices, value, annotation) of every leaf of `model`."""
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        key = (*path, field.alias or name)
        if isinstance(value, BaseModel):
            yield from leaves(value, key)
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            for i, item in enumerate(value):
                yield from leaves(item, (*key, i))
        else:
            yield key, value, field.annotation


def _literal_choices(annotation: Any) -> list:
    found = []
    for arg in typing.get_args(annotation) or ():
        found += _literal_choices(arg)
    if typing.get_origin(annotation) is typing.Literal:
        found += list(typing.get_args(annotation))
    return found


def candidates(value: Any, annotation: Any, names: list[str] = ()) -> list[Any]:
    """Values to try in place of `value`, most ordinary first; `names` are the stack's own names
    (pools, teams, users) and instance types, for keys that refer to one."""
    others = [c for c in _literal_choices(annotation) if c != value]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [*others, value * 2, value + 1, value - 1, value // 2, 0]
    if isinstance(value, float):
        return [value * 2, value / 2]
    if isinstance(value, ipaddress.IPv4Network):
        moved = int(value.network_address) + 2**16 * 2  # another /16, two over
        return [str(ipaddress.IPv4Network((moved, value.prefixlen)))]
    if isinstance(value, str):
        shorter = value[:-1] if len(value) > 1 else value
        dated = value.replace("v2026", "v2025") if value.startswith("al2023@") else value
        return [
            *others,
            f"{value}x",
            f"{value}-x",
            shorter,
            dated,
            "us-east-1",
            "30m",
            "360h",
            PREBUILT_IMAGE,
            *names,
        ]
    if isinstance(value, list):
        found = [value[:-1]] if value else []
        found += [[*value, c] for c in _literal_choices(annotation) if c not in value]
        if value and all(isinstance(v, ipaddress.IPv4Network) for v in value):
            found.append([*map(str, value), "198.18.77.0/24"])
        if all(isinstance(v, str) for v in value) and PRINCIPAL not in value:
            found.append([*value, PRINCIPAL])
            found.append([*value, "ghcr.io"])  # a registry (devServers.allowedImageRegistries)
        return [*found, [*value, *value[:1]]]
    if value is None:
        return [*others, "30m", True, 1, 250, 2**30, []]
    return others


def _jsonable(value: Any) -> Any:
    if isinstance(value, ipaddress.IPv4Network):
        return str(value)
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _set(values: dict, path: tuple, value: Any, model_values: dict) -> dict:
    """`values` (raw stack config) with `path` set to `value`, sections and items created from
    the validated model where the stack file leaves them to their defaults."""
    edited = copy.deepcopy(values)
    section = _raw_key(path[0])
    if len(path) == 1:
        edited[section] = _jsonable(value)
        return edited
    edited.setdefault(section, copy.deepcopy(model_values[path[0]]))
    node = edited[section]
    defaults = model_values[path[0]]
    for part in path[1:-1]:
        defaults = defaults[part] if defaults is not None else None
        if isinstance(node, list):
            node = node[part]
        else:
            if node.get(part) is None:
                node[part] = copy.deepcopy(defaults)
            node = node[part]
    node[path[-1]] = _jsonable(value)
    return edited


def _valid(values: dict) -> bool:
    try:
        parse_stack_config(values, "Pulumi.edit.yaml")
    except ConfigError:
        return False
    return True


def _name(path: tuple, model_values: dict) -> str:
    parts, node = [path[0]], model_values[path[0]]
    for part in path[1:]:
        node = node[part] if node is not None else None
        if isinstance(part, int):
            name = node.get("name") if isinstance(node, dict) else None
            parts[-1] += f"[{name if name is not None else part}]"
        else:
            parts.append(str(part))
    return ".".join(parts)


def key_edits(values: dict) -> tuple[list[Edit], list[str]]:
    """One valid edit per leaf key, and the keys no candidate could edit validly."""
    config = parse_stack_config(values, "Pulumi.edit.yaml")
    model_values = config.model_dump(by_alias=True, mode="json")
    names = sorted({str(v) for p, v, _ in leaves(config) if p[-1] == "name"})
    names += load_catalog().names(gpu=None)
    edits, stuck = [], []
    for path, value, annotation in leaves(config):
        for candidate in candidates(value, annotation, names):
            if candidate == value or candidate == _jsonable(value):
                continue
            edit = Edit(
                _name(path, model_values),
                lambda v, path=path, c=candidate: _set(v, path, c, model_values),
            )
            if _valid(edit(values)):
                edits.append(edit)
                break
        else:
            stuck.append(_name(path, model_values))
    return edits, stuck


def entry_edits(values: dict) -> list[Edit]:
    """Each named list entry removed, and renamed (with what names it, for the config to hold)."""
    config = parse_stack_config(values, "Pulumi.edit.yaml")
    model_values = config.model_dump(by_alias=True, mode="json")
    found = []
    for path, items in _named_lists(model_values):
        for i, item in enumerate(items):
            for verb, change in (("removed", None), ("renamed", f"{item['name']}-renamed")):

                def edited(v, path=path, name=item["name"], change=change):
                    current = _get(v, path, model_values)
                    # Raises ValueError where another edit already took the entry away.
                    at = [entry["name"] for entry in current].index(name)
                    v = _set(v, path, _changed(current, at, change), model_values)
                    return _follow(v, path, name, change)

                edit = Edit(f"{_name((*path, i), model_values)} {verb}", edited)
                if _valid(edit(values)):
                    found.append(edit)
    return found


def _get(values: dict, path: tuple, model_values: dict) -> Any:
    node = values.get(_raw_key(path[0]), model_values[path[0]])
    for part in path[1:]:
        node = node[part]
    return node


def _named_lists(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, list]]:
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _named_lists(child, (*path, key))
    elif isinstance(node, list) and node and all(isinstance(i, dict) and "name" in i for i in node):
        yield path, node


def _changed(items: list, i: int, new_name: str | None) -> list:
    if new_name is None:
        return items[:i] + items[i + 1 :]
    return [{**item, "name": new_name} if j == i else item for j, item in enumerate(items)]


# Where other sections name an entry: a team (jobs' queue, users' team), a pool (jobs, flavors).
REFERENCES = {
    ("queues", "teams"): [("jobs", "queue"), ("devServers", "users", "team")],
    ("nodePools",): [("jobs", "nodePool"), ("devServers", "flavors", "nodePool")],
}


def _follow(values: dict, path: tuple, old: str, new: str | None) -> dict:
    """Entries elsewhere that named the removed or renamed entry: renamed along, or removed."""
    for where in REFERENCES.get(path, []):
        *list_path, field = where
        section = _raw_key(list_path[0])
        node = values.get(section)
        for part in list_path[1:]:
            node = (node or {}).get(part)
        if not isinstance(node, list):
            continue
        kept = [
            {**item, field: new} if item.get(field) == old and new else item
            for item in node
            if item.get(field) != old or new
        ]
        node[:] = kept
    return values
