"""JSON-Schema validation of call arguments (Draft 2020-12, via the ``jsonschema`` package).

Tool specs in the wild use non-standard type names (BFCL: ``dict``, ``float``, ``tuple``,
``any``); :func:`normalize_schema` maps them to JSON Schema before validation. Validators are
cached per (normalised) schema.

Tool schemas and model output are untrusted (see SECURITY.md and docs/schemas.md):

- ``$ref`` never reaches the network: the registry refuses every retrieval, so a remote ref
  (absolute or ``$id``-relative) is a ``schema_unresolvable`` violation, and case files with
  unresolvable refs are rejected when they load (:func:`check_tool_schema`).
- ``pattern`` / ``patternProperties`` run on RE2 (linear time, no backtracking) when the
  pattern is RE2 syntax; patterns RE2 cannot run (lookaround, backreferences) fall back to
  Python's ``re`` under a wall-clock budget per validation, and report ``pattern_timeout``
  when it runs out (``pattern_unsafe`` where no budget can be enforced).
- ``format`` is asserted for a fixed list (:data:`ASSERTED_FORMATS`) and nothing else.
- Anything else that goes wrong inside the validator is ``validator_error`` (logged once),
  never a crash and never silently relabelled.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import re
import signal
import threading
import time
from functools import lru_cache
from typing import Any
from urllib.parse import urljoin

import jsonschema._keywords
import jsonschema._utils
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import SchemaError, best_match
from jsonschema_specifications import REGISTRY as SPECIFICATIONS
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import DRAFT202012

from lm_eval_toolfid.core.schema_fast import certainly_valid

try:  # google-re2: linear-time matching; optional at import, a declared dependency
    import re2 as _re2
except ImportError:  # pragma: no cover - exercised by forcing HAVE_RE2 off in tests
    _re2 = None

log = logging.getLogger("lm_eval.toolfid")

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

#: Violation keywords that are not JSON Schema keywords: the schema, not the call, could not be applied.
SCHEMA_UNRESOLVABLE = "schema_unresolvable"  # a $ref that points nowhere, or to a remote document
SCHEMA_INVALID = "schema_invalid"            # the schema itself is not valid JSON Schema
PATTERN_TIMEOUT = "pattern_timeout"          # a backtracking pattern ran past its time budget
PATTERN_UNSAFE = "pattern_unsafe"            # a backtracking pattern where no time budget can be enforced
VALIDATOR_ERROR = "validator_error"          # anything else (RecursionError included), logged once
SPECIAL_KEYWORDS = (SCHEMA_UNRESOLVABLE, SCHEMA_INVALID, PATTERN_TIMEOUT, PATTERN_UNSAFE, VALIDATOR_ERROR)

#: Wall-clock budget (seconds) for the Python-``re`` fallback, per ``validate_arguments`` call.
PATTERN_BUDGET_S = 0.5

#: ``format`` values that are asserted; every other format is an annotation only.
ASSERTED_FORMATS = ("date", "date-time", "email", "uri", "uuid", "ipv4", "ipv6")

HAVE_RE2 = _re2 is not None


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


# --- regular expressions: RE2 first, budgeted backtracking otherwise ------------------------

class PatternTimeout(Exception):
    """A backtracking pattern ran past :data:`PATTERN_BUDGET_S`."""


class PatternUnsafe(Exception):
    """A pattern needs backtracking and no time budget can be enforced here (not the main thread)."""


class _Alarm(BaseException):
    """Raised by the SIGALRM handler; a BaseException so no ``except Exception`` in between eats it."""


_state = threading.local()  # .deadline (monotonic seconds) while validate_arguments runs


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> tuple[str, Any]:
    """("re2", regex) when RE2 runs the pattern, else ("re", regex) for the budgeted fallback."""
    if HAVE_RE2:
        options = _re2.Options()
        options.log_errors = False
        try:
            return "re2", _re2.compile(pattern, options)
        except Exception:  # noqa: BLE001 - RE2 refuses lookaround/backreferences: fall back
            pass
    return "re", re.compile(pattern)


def _budgeted_search(regex: re.Pattern[str], text: str) -> Any:
    deadline = getattr(_state, "deadline", None)
    remaining = (deadline - time.monotonic()) if deadline is not None else PATTERN_BUDGET_S
    if remaining <= 0:
        raise PatternTimeout(regex.pattern)
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        raise PatternUnsafe(regex.pattern)

    def on_alarm(signum: int, frame: Any) -> None:
        raise _Alarm()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, remaining)
    started = time.monotonic()
    try:
        try:
            return regex.search(text)
        finally:  # inside the except below: an alarm landing just as the search ends is still caught
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Alarm:
        raise PatternTimeout(regex.pattern) from None
    finally:
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        if outer_delay > 0:  # someone else's timer was running: give it back what is left
            signal.setitimer(signal.ITIMER_REAL, max(outer_delay - (time.monotonic() - started), 1e-6),
                             outer_interval)


def pattern_search(pattern: str, text: str) -> bool:
    """``re.search`` for schema patterns in bounded time; raises PatternTimeout / PatternUnsafe."""
    engine, regex = _compiled(pattern)
    if engine == "re2":
        return regex.search(text) is not None
    return _budgeted_search(regex, text) is not None


class _GuardedRe:
    """Stands in for the ``re`` module inside jsonschema's keyword code.

    jsonschema matches ``pattern`` and ``patternProperties`` (also inside ``additionalProperties``
    and ``unevaluatedProperties``) with ``re.search(pattern, string)``. While
    :func:`validate_arguments` runs, those searches go to :func:`pattern_search`; at any other
    time (other users of jsonschema in this process) it is plain ``re``.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)

    @staticmethod
    def search(pattern: Any, string: Any, flags: int = 0) -> Any:
        if flags or getattr(_state, "deadline", None) is None or not isinstance(pattern, str):
            return re.search(pattern, string, flags)
        return True if pattern_search(pattern, string) else None


_GUARDED_RE = _GuardedRe()
for _module in (jsonschema._keywords, jsonschema._utils):
    if getattr(_module, "re", None) is re:
        _module.re = _GUARDED_RE  # type: ignore[attr-defined]


# --- formats ------------------------------------------------------------------------------

_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)
_DATE_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.\d+)?(?:[Zz]|[+-](\d{2}):(\d{2}))",
                        re.ASCII)
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s.]+|[^@\s]+@\[[0-9A-Fa-f:.]+\]", re.ASCII)
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*",
                  re.ASCII)


def _is_date(value: str) -> bool:
    m = _DATE.fullmatch(value)
    if not m:
        return False
    _dt.date(*map(int, m.groups()))  # raises ValueError on 2023-02-30
    return True


def _is_date_time(value: str) -> bool:
    m = _DATE_TIME.fullmatch(value)
    if not m:
        return False
    year, month, day, hour, minute, second = map(int, m.groups()[:6])
    _dt.datetime(year, month, day, hour, minute, min(second, 59))  # 60 = leap second
    if m.group(7) is not None and (int(m.group(7)) > 23 or int(m.group(8)) > 59):
        return False
    return second <= 60


def _is_uuid(value: str) -> bool:
    import uuid

    return len(value) == 36 and all(value[i] == "-" for i in (8, 13, 18, 23)) and bool(uuid.UUID(value))


def _is_ipv4(value: str) -> bool:
    import ipaddress

    return bool(ipaddress.IPv4Address(value))


def _is_ipv6(value: str) -> bool:
    import ipaddress

    return "%" not in value and bool(ipaddress.IPv6Address(value))


_FORMAT_FUNCS = {
    "date": _is_date,
    "date-time": _is_date_time,
    "email": lambda v: _EMAIL.fullmatch(v) is not None,
    "uri": lambda v: _URI.fullmatch(v) is not None,
    "uuid": _is_uuid,
    "ipv4": _is_ipv4,
    "ipv6": _is_ipv6,
}


def _format_checker() -> FormatChecker:
    checker = FormatChecker(formats=())  # start empty: nothing is asserted unless listed here
    for name in ASSERTED_FORMATS:
        func = _FORMAT_FUNCS[name]
        checker.checks(name, raises=ValueError)(lambda v, f=func: not isinstance(v, str) or f(v))
    return checker


FORMAT_CHECKER = _format_checker()


# --- references -----------------------------------------------------------------------------

def _refuse_remote(uri: str) -> Any:
    raise NoSuchResource(ref=uri)


_REGISTRY: Registry = Registry(retrieve=_refuse_remote)

_DATA_KEYWORDS = ("enum", "const", "default", "examples")  # values here are data, not schemas


def _refs(node: Any, base: str) -> list[tuple[str, str]]:
    """Every ``(base_uri, ref)`` in a schema, following ``$id`` changes of base."""
    found: list[tuple[str, str]] = []
    stack = [(node, base)]
    while stack:
        item, here = stack.pop()
        if isinstance(item, list):
            stack.extend((v, here) for v in item)
        elif isinstance(item, dict):
            if isinstance(item.get("$id"), str):
                here = urljoin(here, item["$id"])
            for key in ("$ref", "$dynamicRef"):
                if isinstance(item.get(key), str):
                    found.append((here, item[key]))
            stack.extend((v, here) for k, v in item.items() if k not in _DATA_KEYWORDS)
    return found


def unresolvable_ref(schema: dict[str, Any]) -> str | None:
    """The first ``$ref`` in ``schema`` that cannot be resolved locally, described; else None."""
    resource = DRAFT202012.create_resource(schema)
    root = resource.id() or ""
    # the JSON Schema meta-schemas ship with jsonschema (as at validation time): resolvable offline
    registry = _REGISTRY.combine(SPECIFICATIONS).with_resource(root, resource).crawl()
    for base, ref in _refs(schema, root):
        try:
            registry.resolver(base_uri=base).lookup(ref)
        except Unresolvable:
            target = urljoin(base, ref)
            document = target.partition("#")[0]
            if document and document != root.partition("#")[0]:
                return f"$ref {ref!r} points to another document ({document}); remote refs are never fetched: " \
                       f"copy the definition under $defs and use '#/$defs/...'"
            return f"$ref {ref!r} points to nothing in this schema: add it under $defs or fix the ref"
    return None


# --- validators -----------------------------------------------------------------------------

def _canonical(schema: Any) -> str:
    return json.dumps(normalize_schema(schema), sort_keys=True, separators=(",", ":"))


_CANONICAL_BY_ID: dict[int, tuple[Any, str]] = {}


def _canonical_of(schema: Any) -> str:
    """:func:`_canonical`, memoised per schema *object*: a case's tool schemas are loaded once and
    never mutated, so normalising and serialising them on every call (the validator cache key) is
    work done twice. The entry keeps the object alive, so its id cannot be reused by another one."""
    hit = _CANONICAL_BY_ID.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    canonical = _canonical(schema)
    if len(_CANONICAL_BY_ID) >= 8192:
        _CANONICAL_BY_ID.clear()
    _CANONICAL_BY_ID[id(schema)] = (schema, canonical)
    return canonical


@lru_cache(maxsize=4096)
def _validator_for(canonical: str) -> tuple[Draft202012Validator | None, str | None]:
    """(validator, None), or (None, why the schema is not valid JSON Schema)."""
    schema = json.loads(canonical)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        path = "/".join(str(p) for p in exc.absolute_path)
        return None, exc.message[:160] + (f" (at {path})" if path else "")
    return Draft202012Validator(schema, registry=_REGISTRY, format_checker=FORMAT_CHECKER), None


def check_tool_schema(parameters: Any) -> str | None:
    """One-line description of what is wrong with a tool's ``parameters`` schema, or None.

    Checked when cases load: valid Draft 2020-12, every ``$ref`` resolvable without the network,
    no ``$ref`` cycle that never reaches the arguments. A schema checked before (same canonical JSON) gets the
    answer it got then: a case set repeats its tools' schemas (one function in many cases; a file imported, then
    loaded), and the meta-schema check is most of the time loading cases takes.
    """
    if not isinstance(parameters, dict):
        return f"expected an object, got {type(parameters).__name__}"
    try:
        normalized = normalize_schema(parameters)
    except (SchemaError, RecursionError, Unresolvable) as exc:
        return _explain(exc)
    try:
        canonical = json.dumps(normalized, sort_keys=True)
    except (TypeError, ValueError, RecursionError):  # not plain JSON: checked, not kept
        return _check_normalized(normalized)
    found = _CHECKED.get(canonical, _UNCHECKED)
    if found is _UNCHECKED:
        found = _check_normalized(normalized)
        if len(_CHECKED) < _CHECKED_MAX:
            _CHECKED[canonical] = found
    return found  # type: ignore[return-value]


_CHECKED: dict[str, str | None] = {}
_CHECKED_MAX = 16384
_UNCHECKED = object()


def _check_normalized(normalized: dict) -> str | None:
    try:
        Draft202012Validator.check_schema(normalized)
        problem = unresolvable_ref(normalized)
        if problem:
            return problem
        Draft202012Validator(normalized, registry=_REGISTRY).is_valid({})
    except (SchemaError, RecursionError, Unresolvable) as exc:
        return _explain(exc)
    return None


def _explain(exc: Exception) -> str:
    if isinstance(exc, SchemaError):
        path = "/".join(str(p) for p in exc.absolute_path)
        return f"{exc.message}" + (f" (at {path})" if path else "")
    if isinstance(exc, RecursionError):
        return "the schema nests too deeply or its $ref chain is circular"
    return f"a $ref cannot be resolved ({exc})"


class SchemaViolation:
    """The most relevant violation: its keyword, where, and a short message.

    ``keyword`` is the JSON Schema keyword that failed (``type``, ``required``, ``pattern``, ...)
    or one of :data:`SPECIAL_KEYWORDS` when the schema could not be applied to the arguments.
    """

    __slots__ = ("keyword", "path", "message")

    def __init__(self, keyword: str, path: str, message: str) -> None:
        self.keyword, self.path, self.message = keyword, path, message

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"SchemaViolation({self.keyword!r}, {self.path!r}, {self.message!r})"


_warned: set[str] = set()


def _warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        log.warning("toolfid: schema validation failed unexpectedly (%s); such calls are scored "
                    "SCHEMA_ERROR with keyword 'validator_error' (further ones are not logged)", message)


def validate_arguments(arguments: dict[str, Any], parameters: dict[str, Any]) -> SchemaViolation | None:
    """Validate call arguments against a tool's parameter schema; None when valid.

    Runs in bounded time for any schema and any arguments (see the module docstring).
    """
    try:
        canonical = _canonical_of(parameters)
        validator, problem = _validator_for(canonical)
    except (TypeError, ValueError, RecursionError) as exc:  # not JSON-serialisable / absurdly deep
        return SchemaViolation(SCHEMA_INVALID, "", f"schema cannot be used: {type(exc).__name__}: {exc}"[:200])
    if validator is None:
        return SchemaViolation(SCHEMA_INVALID, "", f"schema is not valid JSON Schema: {problem}"[:200])
    if certainly_valid(canonical, arguments):
        return None
    _state.deadline = time.monotonic() + PATTERN_BUDGET_S
    try:
        error = best_match(validator.iter_errors(arguments))
    except PatternTimeout as exc:
        return SchemaViolation(PATTERN_TIMEOUT, "",
                               f"pattern {exc.args[0]!r} ran past its {PATTERN_BUDGET_S:g}s budget"[:200])
    except PatternUnsafe as exc:
        return SchemaViolation(PATTERN_UNSAFE, "", f"pattern {exc.args[0]!r} needs backtracking and cannot be "
                                                   f"time-bounded outside the main thread"[:200])
    except re.error as exc:
        return SchemaViolation(SCHEMA_INVALID, "", f"pattern is not a valid regular expression: {exc}"[:200])
    except Unresolvable as exc:
        return SchemaViolation(SCHEMA_UNRESOLVABLE, "",
                               f"$ref cannot be resolved (never fetched): {getattr(exc, 'ref', exc)}"[:200])
    except RecursionError:
        _warn_once("RecursionError", "RecursionError: arguments or schema nest too deeply")
        return SchemaViolation(VALIDATOR_ERROR, "", "arguments or schema nest too deeply (recursion limit)")
    except Exception as exc:  # noqa: BLE001 - a hostile schema must not crash a run
        _warn_once(type(exc).__name__, f"{type(exc).__name__}: {exc}"[:200])
        return SchemaViolation(VALIDATOR_ERROR, "", f"validator failed: {type(exc).__name__}: {exc}"[:200])
    finally:
        _state.deadline = None
    if error is None:
        return None
    path = "/".join(str(p) for p in error.absolute_path)
    return SchemaViolation(str(error.validator), path, error.message[:200])
