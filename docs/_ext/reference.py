"""Reference pages generated from the code, so they cannot drift from it.

    ```{stack-config} nodePools
    ```                      every key of that top-level section: path, type, default, allowed
                             values, description (the pydantic models' Field(description=...))
    ```{cli-options} deploy.plan
    ```                      a tool's options from its parser() (module, or module:function),
                             the same parser --help prints
    ```{policy-rules}
    ```                      the policy pack's rules (policies.rules.POLICIES)

Every top-level section of the stack config must be shown on some page: the build warns (an
error under -W) about one that is not.
"""

import argparse
import importlib
import re
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from docutils import nodes
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from infra.core.config import NAMESPACE, PATTERN_HINTS
from infra.stack.config import StackConfig

LOG = logging.getLogger(__name__)

# Values typed Any and checked by a validator: what the validator accepts, by its name.
VALIDATED = {
    "ipv4_network": "IPv4 CIDR",
    "_ipv4_address": "IPv4 address",
    "_public_ipv4": "public IPv4 address",
    "_utc_date": "date (YYYY-MM-DD)",
}
SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string"}


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    allowed: str
    description: str


def _unwrap(annotation: Any) -> tuple[Any, list[Any], bool]:
    """(the type, its Annotated metadata, whether None is allowed)."""
    metadata, optional = [], False
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation, *more = get_args(annotation)
            metadata += more
        elif origin in (Union, UnionType) and NoneType in get_args(annotation):
            (annotation,) = [a for a in get_args(annotation) if a is not NoneType]
            optional = True
        else:
            return annotation, metadata, optional


def _constraints(metadata: list[Any], items: bool = False) -> list[str]:
    found: dict[str, Any] = {}
    for meta in metadata:
        if isinstance(meta, FieldInfo):
            found.update((k, v) for m in meta.metadata for k, v in _constraint(m))
        else:
            found.update(_constraint(meta))
    unit = " items" if items else ""
    text = []
    low, high = found.get("ge", found.get("min_length")), found.get("le", found.get("max_length"))
    if low is not None and high is not None:
        text.append(f"{low} to {high}{unit}")
    elif low is not None:
        text.append(f"at least {low}{unit}")
    elif high is not None:
        text.append(f"at most {high}{unit}")
    if "gt" in found:
        text.append(f"more than {found['gt']}")
    if "pattern" in found:
        text.append(PATTERN_HINTS.get(found["pattern"], f"`{found['pattern']}`"))
    return text


def _constraint(meta: Any):
    for kind, name in (
        (annotated_types.Ge, "ge"),
        (annotated_types.Gt, "gt"),
        (annotated_types.Le, "le"),
        (annotated_types.MinLen, "min_length"),
        (annotated_types.MaxLen, "max_length"),
    ):
        if isinstance(meta, kind):
            yield name, getattr(meta, name)
    if getattr(meta, "pattern", None):
        yield "pattern", meta.pattern


def _describe(annotation: Any, metadata: list[Any]) -> tuple[str, list[str]]:
    """(type, allowed values) of an annotation."""
    annotation, more, _ = _unwrap(annotation)
    metadata = metadata + more
    origin = get_origin(annotation)
    if origin in (Union, UnionType):
        # A choice of types (a duration or `Never`): each described, joined.
        described = [_describe(a, metadata) for a in get_args(annotation)]
        kinds = " or ".join(dict.fromkeys(kind for kind, _ in described))
        return kinds, [a for _, allowed in described for a in allowed]
    if origin is Literal:
        values = get_args(annotation)
        kind = SCALARS.get(type(values[0]), "value")
        return kind, [", ".join(f"`{v}`" for v in values)]
    if origin is list:
        item, item_type_allowed = _describe(get_args(annotation)[0], [])
        allowed = [f"each: {a}" for a in item_type_allowed]
        return f"list of {item}s", _constraints(metadata, items=True) + allowed
    if origin is dict:
        key, value = (_describe(a, [])[0] for a in get_args(annotation))
        return f"map of {key} to {value}", _constraints(metadata, items=True)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping", []
    if annotation is Any:
        names = [getattr(m, "func", None) for m in metadata]
        kinds = [VALIDATED[f.__name__] for f in names if f and f.__name__ in VALIDATED]
        if not kinds:
            raise TypeError(f"no type name for Any checked by {names}: add it to VALIDATED")
        return kinds[0], _constraints(metadata)
    if annotation in SCALARS:
        return SCALARS[annotation], _constraints(metadata)
    raise TypeError(f"no type name for {annotation!r}")


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory else field.default
    if value is None or value is PydanticUndefined:
        return "none"
    if isinstance(value, BaseModel):
        return "see its keys"
    if isinstance(value, bool):
        return str(value).lower()
    if value == "":
        return '""'
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def _models(annotation: Any) -> list[type[BaseModel]]:
    annotation, _, _ = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) is list:
        return _models(get_args(annotation)[0])
    return []


def rows(model: type[BaseModel], prefix: str) -> list[Row]:
    """A row per key of `model`, nested sections after their key, in declaration order."""
    found = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        path = f"{prefix}.{key}" if prefix else key
        kind, allowed = _describe(field.annotation, list(field.metadata))
        description = field.description or ""
        if not description:
            raise ValueError(f"{NAMESPACE}:{path} has no Field(description=...)")
        found.append(Row(path, kind, _default(field), "; ".join(allowed), description))
        is_list = get_origin(_unwrap(field.annotation)[0]) is list
        for sub in _models(field.annotation):
            found += rows(sub, f"{path}[]" if is_list else path)
    return found


def stack_sections() -> dict[str, list[Row]]:
    """{top-level key: its rows}; `aws:region` for the region, which lives in the aws namespace."""
    sections: dict[str, list[Row]] = {}
    for row in rows(StackConfig, ""):
        top = re.split(r"[.\[]", row.key)[0]
        if top == "region":
            row = Row("aws:region", *list(row.__dict__.values())[1:])
            top = "aws:region"
        sections.setdefault(top, []).append(row)
    return sections


def _inline(text: str) -> list[nodes.Node]:
    """Text with `code` spans as literals."""
    parts = re.split(r"`([^`]+)`", text)
    return [nodes.literal(p, p) if i % 2 else nodes.Text(p) for i, p in enumerate(parts) if p]


def table(headers: list[str], body: list[list[list[nodes.Node]]], widths: list[int]) -> nodes.table:
    group = nodes.tgroup(cols=len(headers))
    group += [nodes.colspec(colwidth=w) for w in widths]
    head = nodes.thead()
    head += nodes.row("", *[nodes.entry("", nodes.paragraph("", h)) for h in headers])
    rows_ = nodes.tbody()
    for cells in body:
        rows_ += nodes.row("", *[nodes.entry("", nodes.paragraph("", "", *c)) for c in cells])
    group += [head, rows_]
    return nodes.table("", group, classes=["reference-table"])


class StackConfigDirective(SphinxDirective):
    """The keys of one top-level section as a definition list: the key, then its type, default
    and allowed values on one line, then its description."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        section = self.arguments[0]
        sections = stack_sections()
        if section not in sections:
            raise self.error(f"no stack config section {section!r}; allowed: {', '.join(sections)}")
        shown(self.env)[section] = self.env.docname
        items = nodes.definition_list(classes=["stack-config"])
        for row in sections[section]:
            default = row.default
            if default not in ("required", "none", "see its keys"):
                default = f"`{default}`"
            facts = [f"{row.type}", f"default: {default}"]
            if row.allowed:
                facts.append(f"allowed: {row.allowed}")
            item = nodes.definition_list_item()
            item += nodes.term("", "", nodes.literal(row.key, row.key))
            definition = nodes.definition()
            definition += nodes.paragraph("", "", *_inline("; ".join(facts)), classes=["facts"])
            definition += nodes.paragraph("", "", *_inline(row.description))
            item += definition
            items += item
        return [items]


def parser_of(target: str) -> argparse.ArgumentParser:
    """`module` (its parser()) or `module:function`: the parser a tool's main uses."""
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function or "parser")()


def _actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            yield action


class CliOptionsDirective(SphinxDirective):
    """A tool's usage, description and options, as its --help prints them, per subcommand."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        parser = parser_of(self.arguments[0])
        return self._parser(parser, parser.prog)

    def _parser(self, parser: argparse.ArgumentParser, prog: str) -> list[nodes.Node]:
        formatter = parser._get_formatter()
        usage = parser.format_usage().removeprefix("usage: ").strip()
        out: list[nodes.Node] = [nodes.literal_block(usage, usage, language="text")]
        body = []
        for action in _actions(parser):
            name = ", ".join(action.option_strings) or action.dest
            if action.option_strings and action.nargs != 0:
                name += " " + formatter._format_args(
                    action, formatter._get_default_metavar_for_optional(action)
                )
            elif not action.option_strings:
                name = formatter._get_default_metavar_for_positional(action)
            text = formatter._expand_help(action) if action.help else ""
            if action.choices and action.metavar is not None:
                text += f" (one of: {', '.join(map(str, action.choices))})"
            elif action.choices:
                text += f" (one of: {', '.join(f'`{c}`' for c in action.choices)})"
            body.append([[nodes.literal(name, name)], _inline(text)])
        if body:
            out.append(table(["option", "what it does"], body, [30, 70]))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, sub in action.choices.items():
                    title = f"{prog} {name}"
                    out.append(nodes.rubric(title, title))
                    out.append(nodes.paragraph("", "", *_inline(helps.get(name) or "")))
                    out += self._parser(sub, title)
        return out


class PolicyRulesDirective(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        from policies.rules import POLICIES

        body = [[[nodes.literal(p.name, p.name)], _inline(p.description)] for p in POLICIES]
        return [table(["rule", "what it holds"], body, [30, 70])]


def shown(env) -> dict[str, str]:
    """{stack config section: the page showing it}, kept in the build environment."""
    if not hasattr(env, "stack_config_shown"):
        env.stack_config_shown = {}
    return env.stack_config_shown


def check_every_section_shown(app, env) -> None:
    for section in stack_sections():
        if section not in shown(env):
            LOG.warning(
                "stack config section %s is on no page: add ```{stack-config} %s```",
                section,
                section,
            )


def purge(app, env, docname: str) -> None:
    for section in [s for s, d in shown(env).items() if d == docname]:
        del shown(env)[section]


def merge(app, env, docnames, other) -> None:
    shown(env).update(shown(other))


def setup(app):
    app.add_directive("stack-config", StackConfigDirective)
    app.add_directive("cli-options", CliOptionsDirective)
    app.add_directive("policy-rules", PolicyRulesDirective)
    app.connect("env-check-consistency", check_every_section_shown)
    app.connect("env-purge-doc", purge)
    app.connect("env-merge-info", merge)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
