"""Validate rendered custom resources against the upstream CRDs vendored in tests/crds.

CRD schemas accept unknown fields, so a misspelled optional field would pass. Every object schema
that lists `properties` and does not preserve unknown fields is closed here
(`additionalProperties: false`), as the API server's structural pruning would drop such fields.
CEL rules (`x-kubernetes-validations`) are not evaluated.
"""

import copy
from functools import cache
from pathlib import Path

import yaml
from openapi_schema_validator import OAS30Validator

CRD_DIR = Path(__file__).resolve().parent / "crds"


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


@cache
def served_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> closed openAPIV3Schema, for every served version of every CRD."""
    schemas = {}
    for path in sorted(CRD_DIR.rglob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
            continue
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
                schemas[(f"{group}/{version['name']}", kind)] = _closed(schema)
    return schemas


def conformance_errors(manifest: dict) -> list[str]:
    """Every way `manifest` breaks its CRD's schema; empty when it conforms."""
    key = (manifest.get("apiVersion"), manifest.get("kind"))
    schema = served_schemas().get(key)
    if schema is None:
        served = sorted(f"{v} {k}" for v, k in served_schemas() if k == key[1])
        return [f"{key[0]} {key[1]} is not served by any CRD; served: {served}"]
    validator = OAS30Validator(schema)
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in validator.iter_errors(manifest)
    ]
