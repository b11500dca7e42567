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

MAX_SCAN_CHARS = 50_000  # absurd outputs are truncated for scanning, never crash the parser
MAX_START_ATTEMPTS = 200  # bounds the embedded-object search on hostile text

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


def balanced_from(text: str, start: int) -> int | None:
    """Index just past the ``}`` that closes the ``{`` at ``start`` (braces in strings ignored)."""
    depth, in_string, escape = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def balanced_objects(text: str, max_attempts: int = MAX_START_ATTEMPTS) -> list[str]:
    """Balanced ``{...}`` substrings that parse as JSON, left to right.

    A ``{`` in prose can open a span that never parses; then the scan restarts at the next
    ``{`` rather than giving up, so ``He said "hi {" then {...}`` still finds the call.
    """
    found: list[str] = []
    pos = text.find("{")
    attempts = 0
    while pos != -1 and attempts < max_attempts:
        attempts += 1
        end = balanced_from(text, pos)
        if end is not None and isinstance(_loads(text[pos:end]), (dict, list)):
            found.append(text[pos:end])
            pos = text.find("{", end)
        else:
            pos = text.find("{", pos + 1)
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
