"""Bare JSON: the whole generation is one call object, or an array of them.

``{"name": "get_weather", "arguments": {"city": "Paris"}}``
"""

from __future__ import annotations

from typing import Any

from lm_eval_toolfid.core.records import SurfaceFormat
from lm_eval_toolfid.formats.calls import Found, calls_from_value
from lm_eval_toolfid.formats.common import dumps, whole_json

SURFACE = SurfaceFormat.BARE_JSON


def parse(text: str) -> Found | None:
    ok, value = whole_json(text)
    return calls_from_value(value, SURFACE) if ok else None


def render(name: str, arguments: dict[str, Any], markers: bool = True) -> str:
    return dumps({"name": name, "arguments": arguments})


RENDERERS = {"bare_json": render}
