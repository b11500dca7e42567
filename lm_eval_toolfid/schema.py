"""JSON-Schema validation of call arguments (Draft 2020-12, via the ``jsonschema`` package).

Tool specs in the wild use non-standard type names (BFCL: ``dict``, ``float``, ``tuple``,
``any``); :func:`normalize_schema` maps them to JSON Schema before validation. Validators are
cached per (normalised) schema, and ``$ref`` never reaches the network.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from referencing import Registry
from referencing.exceptions import NoSuchResource

TYPE_ALIASES: dict[str, str | None] = {
    "dict": "object",
    "float": "number",
    "double": "number",
    "tuple": "array",
    "list": "array",
    "int": "integer",
    "str": "string",
    "bool": "boolean",
    "any": None,  # unconstrained
}

# Keywords whose value is a schema / list of schemas / map of schemas.
_SUBSCHEMA = ("items", "additionalProperties", "not", "contains", "propertyNames", "unevaluatedProperties",
              "unevaluatedItems", "if", "then", "else")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _map_type(value: Any) -> Any:
    if isinstance(value, str):
        return TYPE_ALIASES.get(value, value)
    if isinstance(value, list):
        mapped = [TYPE_ALIASES.get(v, v) if isinstance(v, str) else v for v in value]
        return None if None in mapped else mapped
    return value


def normalize_schema(schema: Any) -> Any:
    """Return a copy of ``schema`` with BFCL-style type names mapped to JSON Schema."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            mapped = _map_type(value)
            if mapped is not None:
                out["type"] = mapped
        elif key in _SUBSCHEMA:
            out[key] = normalize_schema(value)
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [normalize_schema(v) for v in value]
        elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: normalize_schema(v) for k, v in value.items()}
        else:
            out[key] = value
    return out


def _refuse_remote(uri: str) -> Any:
    raise NoSuchResource(ref=uri)


_REGISTRY: Registry = Registry(retrieve=_refuse_remote)


@lru_cache(maxsize=4096)
def _validator_for(canonical: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(canonical), registry=_REGISTRY)


def _canonical(schema: Any) -> str:
    return json.dumps(normalize_schema(schema), sort_keys=True, separators=(",", ":"))


def check_tool_schema(parameters: Any) -> str | None:
    """One-line description of what is wrong with a tool's ``parameters`` schema, or None."""
    if not isinstance(parameters, dict):
        return f"expected an object, got {type(parameters).__name__}"
    try:
        Draft202012Validator.check_schema(normalize_schema(parameters))
    except SchemaError as exc:
        path = "/".join(str(p) for p in exc.absolute_path)
        return f"{exc.message}" + (f" (at {path})" if path else "")
    return None


class SchemaViolation:
    """The most relevant violation: its keyword, where, and a short message."""

    __slots__ = ("keyword", "path", "message")

    def __init__(self, keyword: str, path: str, message: str) -> None:
        self.keyword, self.path, self.message = keyword, path, message

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"SchemaViolation({self.keyword!r}, {self.path!r}, {self.message!r})"


def validate_arguments(arguments: dict[str, Any], parameters: dict[str, Any]) -> SchemaViolation | None:
    """Validate call arguments against a tool's parameter schema; None when valid."""
    validator = _validator_for(_canonical(parameters))
    try:
        error = best_match(validator.iter_errors(arguments))
    except Exception as exc:  # unresolvable $ref and the like: the spec's fault, reported as such
        return SchemaViolation("$ref", "", f"schema could not be applied: {exc}"[:200])
    if error is None:
        return None
    path = "/".join(str(p) for p in error.absolute_path)
    return SchemaViolation(str(error.validator), path, error.message[:200])
