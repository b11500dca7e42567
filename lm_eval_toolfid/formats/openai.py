"""OpenAI-style objects: ``{"tool_calls": [{"type": "function", "function": {"name": "f",
"arguments": "{\\"a\\": 1}"}}]}``, ``{"function": {...}}`` and ``{"name": "f", "arguments": "<json>"}``.

The unwrapping lives in :mod:`.calls` (it applies inside any container). Arguments given as a
JSON string are decoded and the call is flagged ``arguments_string_decoded``; scoring decides
whether such a call counts (by default it is valid, and the flag is kept on the call).
"""

from __future__ import annotations

import json
from typing import Any

from lm_eval_toolfid.core.records import SurfaceFormat
from lm_eval_toolfid.formats.common import dumps

SURFACE = SurfaceFormat.OPENAI


def _function(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}


def render(name: str, arguments: dict[str, Any], markers: bool = True) -> str:
    return dumps({"tool_calls": [{"id": "call_0", "type": "function", "function": _function(name, arguments)}]})


def render_function(name: str, arguments: dict[str, Any], markers: bool = True) -> str:
    return dumps({"type": "function", "function": _function(name, arguments)})


def render_string_args(name: str, arguments: dict[str, Any], markers: bool = True) -> str:
    return dumps(_function(name, arguments))


RENDERERS = {"openai": render, "openai_function": render_function, "openai_string_args": render_string_args}
