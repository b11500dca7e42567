"""JSON-safe, bounded copies of untrusted values (model output): what records and files keep.

Used by the parser (``formats``) and the records; depends on nothing else in the package.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Replace lone surrogates (what undecodable bytes become) with U+FFFD."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


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
