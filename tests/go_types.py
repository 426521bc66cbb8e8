"""A closed JSON schema from upstream Go API types (kubebuilder style), to check a document against
the struct it is decoded into rather than against what our code happens to write.

Reads `type X struct { Field T \\`json:"name,omitempty"\\` }` blocks (embedded `json:",inline"`
structs merge into their parent), `type X string` with the constants of that type as its enum, and
pointers, slices and maps of those. Types of other packages come from `external`, given by the
caller with where upstream defines them. Every struct is closed: Kubernetes' strict decoding (what
Kueue and nodeadm use for their configuration) refuses unknown fields.
"""

import re

SCALARS = {
    "string": {"type": "string"},
    "bool": {"type": "boolean"},
    "float32": {"type": "number"},
    "float64": {"type": "number"},
    **{t: {"type": "integer"} for t in ("int", "int32", "int64", "uint", "uint32", "uint64")},
}
_STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.M | re.S)
_FIELD = re.compile(r"^\s+(?:(\w+)\s+)?([\w.*\[\]]+)\s+`json:\"([^\"]*)\"`", re.M)
_STRING_TYPE = re.compile(r"^type (\w+) string$", re.M)
_CONST = re.compile(r"^(?:\s+|const )\w+\s+(\w+)\s*=\s*\"([^\"]*)\"", re.M)


def struct_fields(source: str) -> dict[str, list[tuple[str, str]]]:
    """struct name -> [(json name, Go type)], "" as the name of an inline (embedded) field."""
    structs = {}
    for name, body in _STRUCT.findall(source):
        fields = []
        for _, go_type, tag in _FIELD.findall(body):
            json_name = tag.split(",")[0]
            if json_name != "-":
                fields.append((json_name if "inline" not in tag else "", go_type))
        structs[name] = fields
    return structs


def string_enums(source: str) -> dict[str, list[str]]:
    """Each `type X string` and the values of its constants (empty: any string)."""
    enums = {name: [] for name in _STRING_TYPE.findall(source)}
    for type_name, value in _CONST.findall(source):
        if type_name in enums:
            enums[type_name].append(value)
    return enums


def closed_schema(source: str, root: str, external: dict[str, dict]) -> dict:
    structs, enums = struct_fields(source), string_enums(source)

    def schema_of(go_type: str) -> dict:
        go_type = go_type.lstrip("*")
        if go_type.startswith("[]"):
            return {"type": "array", "items": schema_of(go_type[2:])}
        if go_type.startswith("map["):
            return {"type": "object", "additionalProperties": schema_of(go_type.split("]", 1)[1])}
        if go_type in SCALARS:
            return SCALARS[go_type]
        if go_type in enums:
            values = enums[go_type]
            return {"type": "string", **({"enum": values} if values else {})}
        if go_type in structs:
            return struct_schema(go_type)
        if go_type in external:
            return external[go_type]
        raise KeyError(f"no schema for Go type {go_type}: add it to `external`")

    def properties(name: str) -> dict:
        found = {}
        for json_name, go_type in structs[name]:
            if json_name:
                found[json_name] = schema_of(go_type)
            else:
                embedded = schema_of(go_type)
                found |= embedded.get("properties", {})
        return found

    def struct_schema(name: str) -> dict:
        return {"type": "object", "properties": properties(name), "additionalProperties": False}

    return struct_schema(root)
