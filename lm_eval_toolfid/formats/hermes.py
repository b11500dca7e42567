"""Hermes / Qwen2.5 tags: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Several tags give several calls; an unclosed last tag runs to the end of the text (generation
often stops before the closer). A body that holds Qwen3-coder XML (``<function=...>``) is
parsed as that format, a body that is a pythonic call list as :mod:`.pythonic`. Bodies are cut at the next opener or closer, so every character belongs
to at most one body and the whole pass is linear.
"""

from __future__ import annotations

from typing import Any

from lm_eval_toolfid.core.records import SurfaceFormat
from lm_eval_toolfid.formats import pythonic, qwen_xml
from lm_eval_toolfid.formats.calls import Found, calls_in_text
from lm_eval_toolfid.formats.common import Finder, dumps, nearest
from lm_eval_toolfid.formats.limits import MAX_CALLS

SURFACE = SurfaceFormat.HERMES
OPEN, CLOSE = "<tool_call>", "</tool_call>"


def parse(text: str) -> Found | None:
    """None when no ``<tool_call>`` tag appears; else what the tags held (maybe nothing)."""
    if OPEN not in text:
        return None
    opens, closes = Finder(text, OPEN), Finder(text, CLOSE)
    found = Found()
    pos, seen = opens.find(0), 0
    while pos != -1 and seen < MAX_CALLS:
        seen += 1
        start = pos + len(OPEN)
        end = nearest(opens.find(start), closes.find(start), default=len(text))
        if qwen_xml.OPEN in text[start:end]:
            found.extend(qwen_xml.parse_region(text, start, end))
        else:
            before = len(found.calls) + len(found.others)
            found.extend(calls_in_text(text, SURFACE, start, end))  # a broken object's pieces are not calls
            if len(found.calls) + len(found.others) == before:
                body, _ = pythonic.parse(text[start:end])  # ``<tool_call>[f(a=1)]</tool_call>``
                if body is not None:
                    found.extend(body)
        pos = opens.find(end)
    return found


def render(name: str, arguments: dict[str, Any], markers: bool = True) -> str:
    body = dumps({"name": name, "arguments": arguments})
    return f"{OPEN}\n{body}\n{CLOSE}" if markers else body


RENDERERS = {"hermes": render}
