"""Fenced code block: a Markdown ```` ``` ```` block holding a JSON call (or a pythonic call).

```` ```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n``` ````

Fences are paired left to right with ``str.find`` (linear); the info string (``json``,
``python``...) on the opening line is skipped. An unclosed last fence runs to the end. At most
``MAX_CALLS`` blocks are read.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

from lm_eval_toolfid.core.records import SurfaceFormat
from lm_eval_toolfid.formats import pythonic
from lm_eval_toolfid.formats.calls import Found, calls_from_value
from lm_eval_toolfid.formats.common import dumps, whole_json
from lm_eval_toolfid.formats.limits import MAX_CALLS

SURFACE = SurfaceFormat.FENCED
FENCE = "```"
_INFO = re.compile(r"[A-Za-z0-9_+.-]*[ \t]*(?:\n|$)")


def bodies(text: str) -> Iterator[str]:
    pos = text.find(FENCE)
    while pos != -1:
        start = pos + len(FENCE)
        info = _INFO.match(text, start)
        if info:
            start = info.end()
        close = text.find(FENCE, start)
        yield text[start:] if close == -1 else text[start:close]
        if close == -1:
            return
        pos = text.find(FENCE, close + len(FENCE))


def parse(text: str) -> tuple[Found | None, bool]:
    """``(found, pythonic_attempted)`` over every fenced block; the first block with calls wins."""
    if FENCE not in text:
        return None, False
    first: Found | None = None
    attempted = False
    for n, body in enumerate(bodies(text)):
        if n >= MAX_CALLS:
            break
        ok, value = whole_json(body)
        if ok:
            found = calls_from_value(value, SURFACE)
        else:
            found, tried = pythonic.parse(body)
            attempted = attempted or tried
        if found is not None and found.calls:
            return found, attempted
        if first is None and found is not None and found.others:
            first = found
    return first, attempted


def render(name: str, arguments: dict[str, Any], markers: bool = True) -> str:
    return "```json\n" + dumps({"name": name, "arguments": arguments}) + "\n```"


RENDERERS = {"fenced": render}
