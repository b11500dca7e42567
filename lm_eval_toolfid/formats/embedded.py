"""JSON embedded in prose: every balanced object/array found in one linear scan.

``I'll look that up. {"name": "get_weather", "arguments": {"city": "Paris"}} Done.``

Call-shaped objects win over other JSON (``Using {"type": "object"} I call {...}`` finds the
call). An object found only inside an outer object that does not parse (never closed, or not
JSON: ``{"name": "f", "arguments": {"city": "Osaka"}``) is a piece of a broken call, not JSON
written on its own: it is neither a call nor another object (:attr:`Found.broken`; scoring says
``malformed``). When the main pass finds no call (a stray quote in prose can flip the string
state), a second pass restarts at each ``{"name"``/``{"function"``/``{"tool_calls"`` left to
right; each restart either closes (the next one starts after it) or runs to the end (and the
pass stops), so both passes together stay linear. The restart pass does not take back a call that
is a piece of a broken outer object (decoding the outer object read past the call, or failed right
where it starts): a truncated array of calls is a broken answer, not its first call.
"""

from __future__ import annotations

import re
from typing import Any

from lm_eval_toolfid.core.records import SurfaceFormat
from lm_eval_toolfid.formats.calls import Found, calls_from_value, calls_in_text
from lm_eval_toolfid.formats.common import dumps
from lm_eval_toolfid.formats.limits import MAX_DECODES, MAX_DEPTH, safe_loads
from lm_eval_toolfid.formats.scan import first_span_at

SURFACE = SurfaceFormat.EMBEDDED
_CALL_START = re.compile(r'\{\s*"(?:name|function|tool_calls)"\s*:')


def parse(text: str, surface: SurfaceFormat = SURFACE) -> Found:
    found = calls_in_text(text, surface)
    if not found.calls:
        _restart_pass(text, surface, found)
    return found


def _piece_of_broken(start: int, end: int, broken_at: list[tuple[int, int]]) -> bool:
    """The object at ``text[start:end]`` is part of an outer object that does not parse: decoding that object
    read past it (a truncated list of calls), or failed right where it starts (a missing comma before it).
    An outer "object" whose decoding failed before it is prose with a brace (``He said "hi {" and then {...}``)."""
    return any(a < start and (error >= end or error == start) for a, error in broken_at)


def _restart_pass(text: str, surface: SurfaceFormat, found: Found) -> None:
    after, decodes = 0, 0
    for m in _CALL_START.finditer(text):
        if m.start() < after:
            continue
        if decodes >= MAX_DECODES:
            return
        decodes += 1
        span = first_span_at(text, m.start())
        if span is None:
            return
        after = span.end
        if span.height <= MAX_DEPTH and not _piece_of_broken(span.start, span.end, found.broken_at):
            ok, value = safe_loads(text[span.start:span.end])
            if ok:
                found.calls.extend(calls_from_value(value, surface).calls)


def render(name: str, arguments: dict[str, Any], markers: bool = True) -> str:
    return "I'll use a tool for this. " + dumps({"name": name, "arguments": arguments}) + " That should do it."


RENDERERS = {"embedded": render}
