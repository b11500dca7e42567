"""Documented limits of the parser, the bounded JSON decoder, and :func:`bounded_copy`.

Every input is cut to ``SCAN_CAP`` characters before anything else happens, so the cost of a
case is bounded whatever the model wrote. Nothing deeper than ``MAX_DEPTH`` brackets is ever
handed to ``json.loads`` or converted from a Python ``ast``; at most ``MAX_DECODES`` candidates
are decoded per text, and at most ``DECODE_BUDGET`` characters in all.
"""

from __future__ import annotations

import json
import math
from typing import Any

from lm_eval_toolfid.core.jsonsafe import clean_text

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


def json_error_at(text: str) -> int:
    """Where strict JSON decoding of ``text`` fails (``len(text)`` when it does not: the value is whole, or only
    its cleaning refused it); 0 when the decoder gives no position. Never raises."""
    try:
        json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        return exc.pos
    except (ValueError, RecursionError, MemoryError, TypeError, OverflowError):
        return 0
    return len(text)


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


