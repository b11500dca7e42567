"""Qwen3-coder XML: ``<function=NAME><parameter=P>VALUE</parameter></function>``.

Usually wrapped in ``<tool_call>`` (see :mod:`.hermes`), also accepted bare. One newline
after ``>`` and one before ``</parameter>`` are dropped; a value is JSON if it parses
(``42``, ``true``, ``null``, ``["a"]``, ``"quoted"``), else the text itself. A missing
``</parameter>`` / ``</function>`` ends at the next parameter / function / end of text.
Repeated parameters: the last wins.
"""

from __future__ import annotations

import json
import re
from typing import Any

from lm_eval_toolfid.core.records import SurfaceFormat, ToolCall
from lm_eval_toolfid.formats.calls import Found
from lm_eval_toolfid.formats.common import Finder, nearest, whole_json
from lm_eval_toolfid.formats.limits import MAX_CALLS, safe_loads

SURFACE = SurfaceFormat.QWEN_XML
OPEN, CLOSE = "<function=", "</function>"
P_OPEN, P_CLOSE = "<parameter=", "</parameter>"
_NAME = re.compile(r"([^<>\n]{1,256})>")
_SCALAR_START = set('-0123456789tfn"')


def parse(text: str) -> Found | None:
    """None when no ``<function=`` appears; else the functions found (maybe none)."""
    if OPEN not in text:
        return None
    return parse_region(text, 0, len(text))


def parse_region(text: str, start: int, end: int) -> Found:
    found = Found()
    funcs, func_ends = Finder(text, OPEN, end), Finder(text, CLOSE, end)
    params, param_ends = Finder(text, P_OPEN, end), Finder(text, P_CLOSE, end)
    pos = funcs.find(start)
    while 0 <= pos < end and len(found.calls) < MAX_CALLS:
        name_m = _NAME.match(text, pos + len(OPEN), end)
        body_start = name_m.end() if name_m else pos + len(OPEN)
        body_end = min(nearest(funcs.find(body_start), func_ends.find(body_start), default=end), end)
        if name_m:
            args = _parameters(text, body_start, body_end, params, param_ends)
            name = name_m.group(1).strip()
            found.calls.append(ToolCall(name=name, arguments=args, surface=SURFACE,
                                        raw={"name": name, "arguments": args}))
        pos = funcs.find(body_end)
    return found


def _parameters(text: str, start: int, end: int, params: Finder, param_ends: Finder) -> dict[str, Any]:
    args: dict[str, Any] = {}
    pos, seen = params.find(start), 0
    while 0 <= pos < end and seen < MAX_CALLS:
        seen += 1
        name_m = _NAME.match(text, pos + len(P_OPEN), end)
        value_start = name_m.end() if name_m else pos + len(P_OPEN)
        value_end = min(nearest(params.find(value_start), param_ends.find(value_start), default=end), end)
        if name_m:
            args[name_m.group(1).strip()] = value_of(text[value_start:value_end])
        pos = params.find(value_end)
    return args


def value_of(raw: str) -> Any:
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    stripped = raw.strip()
    if stripped[:1] in ("{", "["):
        ok, value = whole_json(stripped)
        return value if ok else raw
    if stripped[:1] in _SCALAR_START:
        ok, value = safe_loads(stripped)
        return value if ok else raw
    return raw


def _value_text(value: Any) -> str:
    """Strings as themselves when that reads back unchanged, else JSON (``<`` escaped)."""
    if isinstance(value, str) and value and value == value.strip() and "<" not in value \
            and value_of(value) == value:
        return value
    return json.dumps(value, ensure_ascii=False).replace("<", "\\u003c")


def render(name: str, arguments: dict[str, Any], markers: bool = True) -> str:
    lines = [f"{OPEN}{name}>"]
    for key, value in arguments.items():
        lines += [f"{P_OPEN}{key}>", _value_text(value), P_CLOSE]
    lines.append(CLOSE)
    body = "\n".join(lines)
    return f"<tool_call>\n{body}\n</tool_call>" if markers else body


RENDERERS = {"qwen_xml": render}
