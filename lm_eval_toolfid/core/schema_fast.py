"""The fast path of schema validation: a tool schema built from the common keyword subset compiled (once) into a
plain-Python predicate that answers "certainly valid".

jsonschema's ``iter_errors`` costs ~50 us for a typical tool call. Most calls are judged against schemas built
from a small subset of keywords (:data:`FAST_KEYWORDS`). The predicate is *sound for valid only*: when it says
True, jsonschema would find no error; anything else (a violation, a keyword outside the subset,
``format``/``pattern``, deep nesting) goes to jsonschema (:mod:`lm_eval_toolfid.core.schema`), which produces the
exact violation. So outcomes are the same with or without it (``tests/test_schema.py`` checks this on every
default case and hostile variants). Schemas come in canonical (normalised, serialised) form, as
:func:`lm_eval_toolfid.core.schema.validate_arguments` keys its caches.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Callable

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated",
                          "readOnly", "writeOnly", "$schema"})
FAST_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "items", "enum", "const",
                           "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
                           "minItems", "maxItems"}) | _ANNOTATIONS


def _strict_equal(a: Any, b: Any) -> bool:
    """Equal with the same JSON types all the way down (implies jsonschema's ``equal``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_strict_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_strict_equal(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":  # 1.0 is left to jsonschema
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "null":
        return value is None
    raise _Unsupported


class _Unsupported(Exception):
    pass


def _fast(schema: Any) -> Callable[[Any], bool]:
    """A predicate that is True only for instances the schema certainly accepts."""
    if schema is True or schema == {}:
        return lambda value: True
    if not isinstance(schema, dict) or not set(schema) <= FAST_KEYWORDS:
        raise _Unsupported
    checks: list[Callable[[Any], bool]] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not kinds or not all(isinstance(k, str) for k in kinds):
            raise _Unsupported
        if not set(kinds) <= {"string", "boolean", "integer", "number", "object", "array", "null"}:
            raise _Unsupported
        checks.append(lambda v, ks=tuple(kinds): any(_type_ok(k, v) for k in ks))
    if "enum" in schema:
        options = schema["enum"]
        if not isinstance(options, list):
            raise _Unsupported
        checks.append(lambda v, o=tuple(options): any(_strict_equal(v, e) for e in o))
    if "const" in schema:
        checks.append(lambda v, c=schema["const"]: _strict_equal(v, c))
    is_num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    for key, ok in (("minimum", lambda v, b: v >= b), ("maximum", lambda v, b: v <= b),
                    ("exclusiveMinimum", lambda v, b: v > b), ("exclusiveMaximum", lambda v, b: v < b)):
        if key in schema:
            bound = schema[key]
            if not is_num(bound):
                raise _Unsupported
            checks.append(lambda v, b=bound, ok=ok: not is_num(v) or ok(v, b))
    for key, ok, typ in (("minLength", lambda n, b: n >= b, str), ("maxLength", lambda n, b: n <= b, str),
                         ("minItems", lambda n, b: n >= b, list), ("maxItems", lambda n, b: n <= b, list)):
        if key in schema:
            bound = schema[key]
            if not isinstance(bound, int) or isinstance(bound, bool):
                raise _Unsupported
            checks.append(lambda v, b=bound, ok=ok, typ=typ: not isinstance(v, typ) or ok(len(v), b))
    if "items" in schema:
        item = _fast(schema["items"])
        checks.append(lambda v, item=item: not isinstance(v, list) or all(item(x) for x in v))
    if {"properties", "required", "additionalProperties"} & set(schema):
        props = schema.get("properties", {})
        required = schema.get("required", [])
        extra = schema.get("additionalProperties", True)
        if not isinstance(props, dict) or not isinstance(required, list) or \
                not all(isinstance(r, str) for r in required):
            raise _Unsupported
        sub = {name: _fast(sch) for name, sch in props.items()}
        extra_check = None if extra is True else (_fast(extra) if isinstance(extra, dict) else None)
        if extra is not True and extra is not False and not isinstance(extra, dict):
            raise _Unsupported

        def obj(v: Any, sub: dict = sub, required: tuple = tuple(required), extra: Any = extra,
                extra_check: Any = extra_check) -> bool:
            if not isinstance(v, dict):
                return True
            for name in required:
                if name not in v:
                    return False
            for name, value in v.items():
                check = sub.get(name)
                if check is not None:
                    if not check(value):
                        return False
                elif extra is False:
                    return False
                elif extra_check is not None and not extra_check(value):
                    return False
            return True

        checks.append(obj)
    return lambda v, checks=tuple(checks): all(c(v) for c in checks)


@lru_cache(maxsize=4096)
def _fast_for(canonical: str) -> Callable[[Any], bool] | None:
    try:
        return _fast(json.loads(canonical))
    except (_Unsupported, RecursionError, TypeError, ValueError):
        return None


def certainly_valid(canonical: str, arguments: Any) -> bool:
    fast = _fast_for(canonical)
    if fast is None:
        return False
    try:
        return bool(fast(arguments))
    except (RecursionError, TypeError, ValueError, OverflowError):
        return False
