"""Small helpers shared by the format modules."""

from __future__ import annotations

import json
from typing import Any

from lm_eval_toolfid.formats.limits import MAX_DEPTH, safe_loads
from lm_eval_toolfid.formats.scan import decoded, first_span_at


class Finder:
    """``str.find`` for one token, remembered: repeated forward searches stay linear overall."""

    def __init__(self, text: str, token: str, end: int | None = None) -> None:
        self.text, self.token = text, token
        self.end = len(text) if end is None else end
        self._from, self._hit = -1, -1

    def find(self, pos: int) -> int:
        """First occurrence at or after ``pos`` (and before ``end``), else -1."""
        if self._from != -1 and self._from <= pos and (self._hit == -1 or self._hit >= pos):
            return self._hit
        self._from, self._hit = pos, self.text.find(self.token, pos, self.end)
        return self._hit


def nearest(*positions: int, default: int) -> int:
    """The smallest non-negative position, else ``default``."""
    hits = [p for p in positions if p >= 0]
    return min(hits) if hits else default


def whole_json(text: str) -> tuple[bool, Any]:
    """``(ok, value)`` when all of ``text`` (stripped) is one JSON object or array within the depth cap."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[" or stripped[-1] not in "}]":
        return False, None
    span = first_span_at(stripped, 0)
    if span is None or span.end != len(stripped) or span.height > MAX_DEPTH:
        return False, None
    return safe_loads(stripped)


def json_values(text: str, start: int = 0, end: int | None = None, too_deep: list[int] | None = None) -> list[Any]:
    """Every decodable JSON object/array in ``text[start:end]``, outermost first, left to right
    (ends of bracket trees too deep to decode are appended to ``too_deep``)."""
    return [d.value for d in decoded(text, start, end, too_deep=too_deep)]


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
