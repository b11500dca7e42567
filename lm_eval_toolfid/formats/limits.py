"""Documented limits of the parser, the bounded JSON decoder, and :func:`bounded_copy`.

Every input is cut to ``SCAN_CAP`` characters before anything else happens, so the cost of a
case is bounded whatever the model wrote. Nothing deeper than ``MAX_DEPTH`` brackets is ever
handed to ``json.loads`` or converted from a Python ``ast``; at most ``MAX_DECODES`` candidates
are decoded per text, and at most ``DECODE_BUDGET`` characters in all.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

SCAN_CAP = 65_536
"""Characters of a generation that are scanned (the first 64 KiB); the rest is ignored."""
MAX_DEPTH = 64
"""Deepest bracket nesting decoded (JSON or Python literal); deeper spans are never decoded."""
MAX_DECODES = 64
"""Most JSON candidates handed to ``json.loads`` for one text."""
DECODE_BUDGET = 8 * SCAN_CAP
"""Most characters handed to ``json.loads`` for one text (all candidates together)."""
MAX_CALLS = 64
"""Most calls, tags or parameters read per generation (per function for parameters)."""
PYTHONIC_CAP = 32_768
"""Longest text handed to ``ast.parse`` for the pythonic format."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Replace lone surrogates (what undecodable bytes become) with U+FFFD."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def safe_loads(text: str) -> tuple[bool, Any]:
    """``(ok, value)``: strict JSON (no NaN/Infinity), never raises.

    Python's int-string limit, RecursionError and MemoryError all count as "did not parse".
    Duplicate keys: the last one wins, as in ``json``. Strings are cleaned of lone surrogates.
    """
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError, MemoryError, TypeError, OverflowError):
        return False, None
    try:
        return True, _clean(value, MAX_DEPTH + 2)
    except (RecursionError, ValueError):  # non-finite number (1e999)
        return False, None


def _clean(obj: Any, depth: int) -> Any:
    if isinstance(obj, str):
        return clean_text(obj)
    if depth <= 0:
        raise RecursionError("too deep")
    if isinstance(obj, dict):
        return {clean_text(k): _clean(v, depth - 1) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v, depth - 1) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):  # 1e999 parses to inf
        raise ValueError("non-finite number")
    return obj


TRUNCATED = "<truncated>"


def bounded_copy(obj: Any, max_depth: int = 32, max_items: int = 1000, max_str: int = 10_000) -> Any:
    """A JSON-safe copy of ``obj`` that any serialiser can write.

    - containers deeper than ``max_depth`` become the string ``"<truncated>"``;
    - lists keep their first ``max_items`` items, dicts their first ``max_items`` keys (then a
      ``"<truncated>"`` item / key is added so the cut is visible);
    - strings (and dict keys) longer than ``max_str`` are cut and end in ``"<truncated>"``;
    - lone surrogates become U+FFFD; tuples become lists; non-string keys become strings;
    - NaN/Infinity become ``None``; ints beyond Python's int-string limit become strings;
    - anything that is not JSON (objects, bytes...) becomes its ``repr``, cut like a string.

    Never raises and never recurses deeper than ``max_depth``.
    """
    return _bounded(obj, max_depth, max_items, max_str)


def _cut(s: str, max_str: int) -> str:
    s = clean_text(s)
    return s if len(s) <= max_str else s[:max_str] + TRUNCATED


def _bounded(obj: Any, depth: int, max_items: int, max_str: int) -> Any:
    if obj is None or isinstance(obj, bool):
        return obj
    if isinstance(obj, int):
        if obj.bit_length() > 13_000:  # ~3900 decimal digits: below the 4300-digit str limit
            return TRUNCATED
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, str):
        return _cut(obj, max_str)
    if isinstance(obj, (dict, list, tuple)):
        if depth <= 0:
            return TRUNCATED
        if isinstance(obj, dict):
            out: dict[str, Any] = {}
            for i, (k, v) in enumerate(obj.items()):
                if i >= max_items:
                    out[TRUNCATED] = TRUNCATED
                    break
                if isinstance(k, str):
                    key = k
                elif k is None or isinstance(k, (bool, int, float)):
                    key = json.dumps(_bounded(k, 0, 0, max_str))
                else:
                    key = _safe_repr(k)
                out[_cut(key, max_str)] = _bounded(v, depth - 1, max_items, max_str)
            return out
        items = [_bounded(v, depth - 1, max_items, max_str) for v in list(obj[:max_items])]
        if len(obj) > max_items:
            items.append(TRUNCATED)
        return items
    return _cut(_safe_repr(obj), max_str)


def _safe_repr(obj: Any) -> str:
    try:
        return repr(obj)[:100_000]
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not escape
        return f"<{type(obj).__name__}>"
