"""Where a case's gold values can be read: the prompt, later user turns, tool results.

The default set's generator checks that every gold string and number is written somewhere the
model can read it, and counts the values only a tool result holds (a follow-up call that must use
an id or a price a search returned).
"""

from __future__ import annotations

import json
import re
from typing import Any

from lm_eval_toolfid.core.records import Case


def number_in_text(value: int | float, text: str) -> bool:
    """``value`` occurs in ``text`` exactly as JSON writes it, not as part of a longer number."""
    literal = re.escape(json.dumps(value))
    return re.search(r"(?<![\d.])" + literal + r"(?!\d|\.\d)", text) is not None


def value_leaves(value: Any, schema: dict[str, Any], path: str = "") -> list[tuple[str, Any]]:
    """``(path, value)`` of every leaf that must be read off the text: strings and numbers that no
    ``enum`` constrains (an enum value may be paraphrased; booleans and nulls are not written)."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return [leaf for k, v in value.items() for leaf in value_leaves(v, props.get(k, {}), f"{path}/{k}")]
    if isinstance(value, list):
        items = schema.get("items", {})
        return [leaf for i, v in enumerate(value) for leaf in value_leaves(v, items, f"{path}/{i}")]
    if "enum" in schema or isinstance(value, bool) or value is None:
        return []
    return [(path, value)]


def in_text(value: Any, text: str) -> bool:
    if isinstance(value, str):
        return value in text
    return isinstance(value, (int, float)) and number_in_text(value, text)


def unrecoverable(value: Any, schema: dict[str, Any], text: str) -> list[str]:
    """Leaves of ``value`` that cannot be read off ``text`` (enum-constrained leaves exempt)."""
    return [f"{path}={leaf!r}" for path, leaf in value_leaves(value, schema) if not in_text(leaf, text)]


def conversation_texts(case: Case) -> tuple[str, str]:
    """(what the user wrote: the prompt and later user turns, what the tools returned)."""
    said = "\n".join([case.prompt] + [m.content or "" for m in case.history if m.role == "user"])
    results = "\n".join(m.content or "" for m in case.history if m.role == "tool")
    return said, results


def result_only_values(case: Case) -> list[str]:
    """Gold values that only a tool result holds (the user never wrote them): ``path=value``."""
    if not case.history or case.gold_tool is None or case.gold_arguments is None:
        return []
    said, results = conversation_texts(case)
    return [f"{path}={leaf!r}" for path, leaf in value_leaves(case.gold_arguments, case.gold_tool.parameters)
            if not in_text(leaf, said) and in_text(leaf, results)]
