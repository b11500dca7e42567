"""Text → tool calls.

Finds JSON in a generation, in order of how unambiguous the boundary is: the whole text,
a fenced code block, then the first balanced ``{...}`` (string- and escape-aware). A JSON
array of objects yields several calls. Every call remembers the surface it came from.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .records import ParsedGeneration, SurfaceFormat, ToolCall

MAX_SCAN_CHARS = 200_000  # absurd outputs are truncated for scanning, never crash the parser

_FENCE = re.compile(r"```[a-zA-Z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _calls_from(obj: Any, surface: SurfaceFormat) -> list[ToolCall]:
    objs = obj if isinstance(obj, list) else [obj]
    return [
        ToolCall(name=o.get("name"), arguments=o.get("arguments"), surface=surface, raw=o)
        for o in objs
        if isinstance(o, dict)
    ]


def balanced_objects(text: str) -> list[str]:
    """Top-level balanced ``{...}`` substrings, left to right (braces inside strings ignored)."""
    found: list[str] = []
    depth, start, in_string, escape = 0, -1, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
        elif ch == '"' and depth > 0:
            in_string = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                found.append(text[start : i + 1])
    return found


def parse_calls(text: str) -> ParsedGeneration:
    """Extract the tool calls a generation contains (possibly none)."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    text = text[:MAX_SCAN_CHARS].strip()
    saw_start = "{" in text

    whole = _loads(text)
    calls = _calls_from(whole, SurfaceFormat.BARE_JSON) if whole is not None else []
    if calls:
        return ParsedGeneration(calls=calls, saw_object_start=saw_start)

    for body in _FENCE.findall(text):
        calls = _calls_from(_loads(body.strip()), SurfaceFormat.FENCED)
        if calls:
            return ParsedGeneration(calls=calls, saw_object_start=saw_start)

    calls = [c for cand in balanced_objects(text) for c in _calls_from(_loads(cand), SurfaceFormat.EMBEDDED)]
    return ParsedGeneration(calls=calls, saw_object_start=saw_start)
