"""Validate rendered custom resources against the upstream CRDs in tests/crds (copied from the
steering repository's shared data), the CRDs written down from upstream's types where none was
copied (WRITTEN_DOWN) and the project's own CRDs (devservers/crds).

CRD schemas accept unknown fields, so a misspelled optional field would pass. Every object schema
that lists `properties` and does not preserve unknown fields is closed here
(`additionalProperties: false`), as the API server's structural pruning would drop such fields.
Formats are checked as the API server checks them (tests.kube_api.server.FORMATS). CEL rules
(`x-kubernetes-validations`) are evaluated separately, by cel_violations.
"""

import copy
import re
from functools import cache
from pathlib import Path

import yaml
from openapi_schema_validator import OAS30Validator

from devservers.api import CRD_DIR as DEVSERVER_CRD_DIR
from infra.kueue.tests.kueue_rules import topology_crd
from tests.kube_api.server import FORMATS
from tests.plugin import ROOT

CRD_DIR = ROOT / "tests" / "crds"
CRD_DIRS = [CRD_DIR, DEVSERVER_CRD_DIR]
WRITTEN_DOWN = [topology_crd()]


def _closed(schema):
    if isinstance(schema, dict):
        schema = {k: _closed(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    return schema


def load_crd(path: Path) -> dict:
    """A CRD file, parsed by libyaml: the Trainer's run to 1 MB, which PyYAML's pure-Python
    loader takes seconds over."""
    return yaml.load(path.read_text(), Loader=yaml.CSafeLoader)


@cache
def crd_versions() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the CRD's version entry, for every version of every CRD."""
    versions = {}
    paths = sorted(p for crd_dir in CRD_DIRS for p in crd_dir.rglob("*.yaml"))
    for crd in [load_crd(path) for path in paths] + WRITTEN_DOWN:
        if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
            continue
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            versions[(f"{group}/{version['name']}", kind)] = version
    return versions


@cache
def served_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> closed openAPIV3Schema, for every served version of every CRD."""
    return {
        key: _closed(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
        for key, version in crd_versions().items()
        if version.get("served")
    }


def conformance_errors(manifest: dict) -> list[str]:
    """Every way `manifest` breaks its CRD's schema; empty when it conforms."""
    key = (manifest.get("apiVersion"), manifest.get("kind"))
    schema = served_schemas().get(key)
    if schema is None:
        served = sorted(f"{v} {k}" for v, k in served_schemas() if k == key[1])
        return [f"{key[0]} {key[1]} is not served by any CRD; served: {served}"]
    validator = OAS30Validator(schema, format_checker=FORMATS)
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in validator.iter_errors(manifest)
    ]


def with_defaults(manifest: dict) -> dict:
    """`manifest` with its CRD's `default`s filled in, as the API server stores it."""

    def fill(schema: dict, value):
        if isinstance(value, dict):
            value = dict(value)
            for key, sub in schema.get("properties", {}).items():
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
                if key in value:
                    value[key] = fill(sub, value[key])
        elif isinstance(value, list) and "items" in schema:
            value = [fill(schema["items"], v) for v in value]
        return value

    return fill(
        crd_versions()[(manifest["apiVersion"], manifest["kind"])]["schema"]["openAPIV3Schema"],
        manifest,
    )


def _cel_find(string, regex):
    """Kubernetes' CEL `<string>.find(<regex>)`: the first match, or '' (k8s.io/apiserver
    pkg/cel/library/regex.go, find: regexp.FindString). cel-python lacks Kubernetes' libraries."""
    from celpy import celtypes

    match = re.search(str(regex), str(string))
    return celtypes.StringType(match.group(0) if match else "")


def _cel_split(string, separator):
    """cel-go's strings extension `<string>.split(<string>)`, which Kubernetes enables for CRD
    rules (google/cel-go ext/strings.go, split: strings.Split; here with a non-empty separator,
    as every vendored rule uses it)."""
    from celpy import celtypes

    return celtypes.ListType(celtypes.StringType(p) for p in str(string).split(str(separator)))


# Kubernetes' CEL library functions the vendored CRDs' rules call, which cel-python lacks.
K8S_CEL_FUNCTIONS = {"find": _cel_find, "split": _cel_split}


def cel_violations(manifest: dict, old: dict | None = None) -> list[str]:
    """Messages of the CRD's CEL rules (x-kubernetes-validations) that `manifest` breaks.

    Evaluated with cel-python on the defaulted object, through objects, list items and map
    values; rules naming oldSelf (transition rules) only when `old` is given, as the API server
    runs them only on updates, and not inside lists (the API server correlates old items only in
    listType=map/set lists, which these CRDs' rules do not sit in). A rule that does not evaluate
    to true, an evaluation error included, is broken.
    """
    import celpy
    from celpy import celtypes

    env = celpy.Environment()
    broken = []

    def walk(schema: dict, value, old_value, path: str):
        for rule in schema.get("x-kubernetes-validations", []):
            transition = "oldSelf" in rule["rule"]
            if transition and old_value is None:
                continue
            activation = {"self": celpy.json_to_cel(value)}
            if transition:
                activation["oldSelf"] = celpy.json_to_cel(old_value)
            program = env.program(env.compile(rule["rule"]), functions=K8S_CEL_FUNCTIONS)
            try:
                result = program.evaluate(activation)
            except celpy.CELEvalError:  # the API server refuses an object a rule errors on
                result = None
            if not (isinstance(result, celtypes.BoolType) and result):
                broken.append(f"{path}: {rule.get('message', rule['rule'])}")
        if isinstance(value, dict):
            for key, sub in schema.get("properties", {}).items():
                if key in value:
                    previous = old_value.get(key) if isinstance(old_value, dict) else None
                    walk(sub, value[key], previous, f"{path}.{key}")
            values_schema = schema.get("additionalProperties")
            if isinstance(values_schema, dict) and "properties" not in schema:
                for key, item in value.items():
                    walk(values_schema, item, None, f"{path}[{key}]")
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                walk(schema["items"], item, None, f"{path}[{i}]")

    key = (manifest["apiVersion"], manifest["kind"])
    schema = crd_versions()[key]["schema"]["openAPIV3Schema"]
    walk(schema, with_defaults(manifest), old and with_defaults(old), "<root>")
    return broken
