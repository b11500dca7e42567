"""Failure shapes of one view, counted from its per-case records: how a prompt style goes wrong on a model.

A case can show several shapes (a valid call in another format that also invents a value):

- ``valid`` — every call well-formed and schema-valid;
- ``other format: <surface>`` — a call parsed, but not in the format the prompt asks for (fenced or
  bare JSON where the chat template asks for ``<tool_call>``);
- ``no call`` (prose or nothing), ``malformed[: <format>]`` (an attempt that does not parse),
  ``wrong shape``, ``schema error: <keyword>``;
- ``schema copied into arguments`` — argument values that are JSON-Schema fragments
  (``{"type": "string", "description": …}``) or the parameter schema itself, instead of values;
- ``invented optional values`` — the call sets optional parameters the expected call does not
  (cases whose gold arguments are given exactly);
- ``wrong tool`` — a parsed call, but not to the expected tool(s);
- ``call where none is expected`` — a parsed call on an irrelevance case.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

from lm_eval_toolfid.core.records import Case, Outcome, OutcomeKind

JSON_SCHEMA_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
_SCHEMA_KEYS = {"properties", "required", "enum", "items", "additionalProperties"}


def _schema_like(value: Any) -> bool:
    """A JSON-Schema fragment where a value belongs: ``{"type": "string", ...}`` or ``{"properties": ...}``."""
    if not isinstance(value, dict):
        return False
    kind = value.get("type")
    if isinstance(kind, str) and kind in JSON_SCHEMA_TYPES:
        return True
    return bool(_SCHEMA_KEYS & set(value)) and ("type" in value or "properties" in value)


def copies_schema(arguments: Any, parameters: dict[str, Any] | None) -> bool:
    if not isinstance(arguments, dict) or not arguments:
        return False
    if parameters and (arguments == parameters or arguments == parameters.get("properties")):
        return True
    return _schema_like(arguments) or any(_schema_like(v) for v in arguments.values())


def invented_optionals(call_name: Any, arguments: Any, case: Case) -> list[str]:
    """Optional parameters the call sets that the expected call (exact gold arguments) leaves out."""
    if not isinstance(arguments, dict):
        return []
    gold = next((g for g in case.expected_calls if g.name == call_name and g.arguments is not None), None)
    tool = next((t for t in case.tools if t.name == call_name), None)
    if gold is None or tool is None:
        return []
    required = set(tool.parameters.get("required") or [])
    return sorted(k for k in arguments if k not in required and k not in gold.arguments)


def shapes_of(outcome: Outcome, case: Case, expected_format: str | None = None) -> list[str]:
    kind = outcome.kind
    if kind is OutcomeKind.NO_CALL:
        return ["no call"]
    if kind is OutcomeKind.MALFORMED:
        return [f"malformed: {outcome.surface}" if outcome.surface else "malformed"]
    shapes = ["valid" if kind is OutcomeKind.VALID else
              "wrong shape" if kind is OutcomeKind.WRONG_SHAPE else f"schema error: {outcome.keyword}"]
    if expected_format and outcome.surface and outcome.surface != expected_format:
        shapes.append(f"other format: {outcome.surface}")
    tools = {t.name: t for t in case.tools}
    calls = outcome.calls or []
    if any(copies_schema(c.arguments, tools[c.name].parameters if c.name in tools else None) for c in calls):
        shapes.append("schema copied into arguments")
    if any(invented_optionals(c.name, c.arguments, case) for c in calls):
        shapes.append("invented optional values")
    if outcome.gold_tool is False:
        shapes.append("wrong tool")
    if case.irrelevant:
        shapes.append("call where none is expected")
    return shapes


def count_shapes(views: Iterable[tuple[Outcome, Case]], expected_format: str | None = None) -> Counter[str]:
    """How many cases show each shape (one view; relevant and irrelevance cases alike)."""
    counts: Counter[str] = Counter()
    for outcome, case in views:
        counts.update(set(shapes_of(outcome, case, expected_format)))
    return counts
