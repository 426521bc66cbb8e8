"""Reading stack config: the stack file's YAML (duplicate keys refused), the Pulumi runtime's
config, and one ConfigError that names every bad key and what is allowed there."""

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import pulumi
import yaml
from pydantic import (
    BaseModel,
    ValidationError,
)

from infra.core.config import (
    NAMESPACE,
    PATTERN_HINTS,
    ConfigError,
    allowed_list,
    did_you_mean,
    key_path,
    one_line,
)
from infra.core.paths import PROJECT_DIR
from infra.stack.config import StackConfig
from infra.stack.cross_references import cross_reference_errors, price_errors
from infra.stack.policy import placeholder_errors


def parse_stack_config(values: Mapping[str, Any], source: str) -> StackConfig:
    """Validate flat Pulumi config (`aws:region`, `training-platform:<key>`, ...) into StackConfig.

    Values may be JSON strings, as the Pulumi engine hands structured config to the program.
    """
    raw: dict[str, Any] = {}
    header = f"Invalid stack config in {source}:\n"
    unloadable = [key for key in values if not isinstance(key, str)]
    if unloadable:
        raise ConfigError(
            header
            + "\n".join(
                f"  {key!r}: a config key that is not a string (YAML reads 123:, true: and ~: "
                "as a number, a boolean, null); the Pulumi CLI cannot load the file; allowed: "
                f"{NAMESPACE}:<name> keys"
                for key in unloadable
            )
        )
    for key, value in values.items():
        # A key without a namespace is the project's (Pulumi's config key rule).
        namespace, _, name = key.partition(":") if ":" in key else (NAMESPACE, ":", key)
        if key == "aws:region":
            raw["region"] = value
        elif namespace == NAMESPACE:
            raw[name] = _decode(value)
    if "region" not in raw:
        raise ConfigError(
            f"{header}  aws:region: missing; "
            "allowed: an AWS region, e.g. `pulumi config set aws:region us-west-2`"
        )
    bad_keys = list(_non_string_keys(raw))
    if bad_keys:
        lines = [
            f"  {key_path(loc, raw)}: key {key!r} is not a string; allowed: camelCase names"
            for loc, key in bad_keys
        ]
        raise ConfigError(header + "\n".join(one_line(line) for line in lines))
    try:
        config = StackConfig.model_validate(raw)
    except ValidationError as e:
        lines = [f"  {key_path(err['loc'], raw)}: {_explain(err)}" for err in e.errors()]
        raise ConfigError(header + "\n".join(one_line(line) for line in lines)) from None
    problems = cross_reference_errors(config) + price_errors(config)
    if problems:
        lines = [f"  {key_path(loc, raw)}: {message}" for loc, message in problems]
        raise ConfigError(header + "\n".join(one_line(line) for line in lines))
    return config


def _non_string_keys(value: Any, loc: tuple = ()):
    """(location, key) of every mapping key that is not a string (YAML allows 1:, null:, true:)."""
    if isinstance(value, dict):
        for key, child in value.items():
            if not isinstance(key, str):
                yield loc, key
            else:
                yield from _non_string_keys(child, (*loc, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _non_string_keys(child, (*loc, i))


class _StackFileLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key (a list or a mapping)
                raise yaml.constructor.ConstructorError(
                    None, None, "a key must be a plain value", key_node.start_mark
                ) from None
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    f"the key {key!r} first given",
                    first.start_mark,
                    "is given again (duplicate key)",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def _load_yaml(path: Path) -> Any:
    try:
        with path.open(encoding="utf-8") as stream:  # marks in errors name the file
            return yaml.load(stream, Loader=_StackFileLoader)
    except UnicodeDecodeError as e:
        raise ConfigError(f"Invalid stack config in {path.name}: not UTF-8 text ({e})") from None
    except yaml.YAMLError as e:
        detail = " ".join(str(e).split())
        raise ConfigError(f"Invalid stack config in {path.name}: not YAML: {detail}") from None


def read_stack_file(stack: str, project_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """The `config:` map of Pulumi.<stack>.yaml, as the Pulumi CLI would pass it."""
    path = project_dir / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        stacks = sorted(
            p.name[len("Pulumi.") : -len(".yaml")] for p in project_dir.glob("Pulumi.*.yaml")
        )
        raise ConfigError(
            f"No stack file {path.name}; "
            + (f"allowed stacks: {', '.join(stacks)}" if stacks else "no Pulumi.<stack>.yaml here")
        )
    document = _load_yaml(path) or {}
    config = document.get("config", {}) if isinstance(document, dict) else None
    if not isinstance(config, dict):
        raise ConfigError(f"Invalid stack config in {path.name}: `config` must be a mapping")
    return config


def load_stack_file(stack: str, project_dir: Path = PROJECT_DIR) -> StackConfig:
    return parse_stack_config(read_stack_file(stack, project_dir), f"Pulumi.{stack}.yaml")


def load_stack_for_command(stack: str) -> StackConfig | None:
    """For command-line tools: the stack's config, or None after printing why it is invalid
    (the caller exits 2)."""
    try:
        return load_stack_file(stack)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


def config_from_pulumi() -> StackConfig:
    """The running stack's config, read from the Pulumi runtime (real engine or mocks)."""
    from pulumi.runtime.config import CONFIG, get_config_env

    stack = pulumi.get_stack()
    # The engine's own YAML reader may keep one of two equal keys; the stack file, when it is
    # here (it is for `pulumi up` from the project), is checked for duplicates by our loader.
    if (PROJECT_DIR / f"Pulumi.{stack}.yaml").is_file():
        read_stack_file(stack, PROJECT_DIR)
    values = {**get_config_env(), **CONFIG.get()}
    source = f"Pulumi.{stack}.yaml"
    config = parse_stack_config(values, source)
    placeholders = placeholder_errors(config)
    if placeholders:
        raise ConfigError(
            f"Invalid stack config in {source}: placeholders left in\n  "
            + "\n  ".join(placeholders)
        )
    return config


def _decode(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _explain(err: dict) -> str:
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(err["loc"][:-1])
        key = str(err["loc"][-1])
        return f"unknown key; {did_you_mean(key, allowed)}" + allowed_list(
            allowed, "allowed: no keys here"
        ).replace("allowed:", "allowed keys here:")
    if err["type"] == "missing":
        return "missing; this key is required"
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "string_pattern_mismatch":
        hint = PATTERN_HINTS.get(err["ctx"]["pattern"])
        message = f"does not match {err['ctx']['pattern']}" + (f"; allowed: {hint}" if hint else "")
    if err["type"] in {"model_type", "dict_type", "model_attributes_type"}:
        message = "must be a mapping of keys to values"
    return message


def _allowed_keys(loc: tuple) -> list[str]:
    """The camelCase keys a model accepts at `loc`, found by walking StackConfig's annotations."""
    annotation: Any = StackConfig
    for part in loc:
        annotation = _model_in(annotation)
        if isinstance(part, int) or annotation is None:
            continue
        field = next(
            (f for n, f in annotation.model_fields.items() if (f.alias or n) == part), None
        )
        annotation = field.annotation if field else None
    model = _model_in(annotation)
    if model is None:
        return []
    # aws:region comes from the aws namespace, not from a training-platform key.
    return sorted(f.alias or n for n, f in model.model_fields.items() if n != "region")


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside Optional[...] / list[...] / Annotated[...], or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if (
        get_origin(annotation) in (Union, list, Annotated)
        or type(annotation).__name__ == "UnionType"
    ):
        for arg in get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None
