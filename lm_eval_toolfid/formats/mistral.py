"""Mistral: ``[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]`` (v3 tokenizers) and
``[TOOL_CALLS]f{...}`` / ``[TOOL_CALLS]f[ARGS]{...}`` (v11+; an optional ``[CALL_ID]id``).

``[TOOL_CALLS]``, ``[ARGS]`` and ``[CALL_ID]`` are special tokens: Hugging Face decoding with
``skip_special_tokens=True`` drops them. Without markers the array form is plain JSON (parsed
as bare JSON) and the inline form becomes ``f{...}g{...}``, which :func:`parse_inline` reads
when the whole text is such a sequence.
"""

from __future__ import annotations

import re
from typing import Any

from lm_eval_toolfid.core.records import SurfaceFormat, ToolCall
from lm_eval_toolfid.formats.calls import Found, calls_from_value
from lm_eval_toolfid.formats.common import Finder, dumps
from lm_eval_toolfid.formats.limits import MAX_CALLS, MAX_DEPTH, safe_loads
from lm_eval_toolfid.formats.scan import first_span_at

SURFACE = SurfaceFormat.MISTRAL
MARKER, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_INLINE = re.compile(r"\s*([A-Za-z_][\w.\-]{0,255})(?:\[CALL_ID\][\w-]{0,64})?(?:\[ARGS\])?(?=\{)")


def _object_at(text: str, at: int, end: int) -> tuple[Any, int] | None:
    span = first_span_at(text, at, end)
    if span is None or span.height > MAX_DEPTH:
        return None
    ok, value = safe_loads(text[span.start:span.end])
    return (value, span.end) if ok else None


def parse(text: str) -> Found | None:
    """None when ``[TOOL_CALLS]`` does not appear; else what follows each marker."""
    if MARKER not in text:
        return None
    found = Found()
    markers = Finder(text, MARKER)
    pos, seen = markers.find(0), 0
    while pos != -1 and seen < MAX_CALLS:
        seen += 1
        start = pos + len(MARKER)
        end = markers.find(start)
        end = len(text) if end == -1 else end
        body_at = len(text[start:end]) - len(text[start:end].lstrip()) + start
        if body_at < end and text[body_at] in "[{":
            hit = _object_at(text, body_at, end)
            if hit is not None:
                found.extend(calls_from_value(hit[0], SURFACE))
        else:
            found.extend(_inline(text, start, end))
        pos = markers.find(end) if end < len(text) else -1
    return found


def _inline(text: str, start: int, end: int) -> Found:
    found = Found()
    pos = start
    while pos < end and len(found.calls) < MAX_CALLS:
        m = _INLINE.match(text, pos, end)
        if m is None:
            break
        hit = _object_at(text, m.end(), end)
        if hit is None or not isinstance(hit[0], dict):
            break
        name, arguments = m.group(1), hit[0]
        found.calls.append(ToolCall(name=name, arguments=arguments, surface=SURFACE,
                                    raw={"name": name, "arguments": arguments}))
        pos = hit[1]
    return found


def parse_inline(text: str) -> Found | None:
    """``f{...}g{...}`` (markers stripped) when the text starts so: a name glued to an object.

    The object is the arguments even when it has ``"name"`` and ``"parameters"`` keys (a BFCL
    reference answer does); prose never glues a word to ``{`` (``Call {...}`` is not read so)."""
    m = _INLINE.match(text)
    if m is None or m.start(1) != 0 and text[:m.start(1)].strip():
        return None
    found = _inline(text, 0, len(text))
    return found if found.calls else None


def render(name: str, arguments: dict[str, Any], markers: bool = True) -> str:
    body = dumps([{"name": name, "arguments": arguments}])
    return MARKER + body if markers else body


def render_args(name: str, arguments: dict[str, Any], markers: bool = True) -> str:
    return (MARKER + name + ARGS + dumps(arguments)) if markers else name + dumps(arguments)


def render_inline(name: str, arguments: dict[str, Any], markers: bool = True) -> str:
    return (MARKER if markers else "") + name + dumps(arguments)


RENDERERS = {"mistral": render, "mistral_args": render_args, "mistral_inline": render_inline}
