"""Llama 3.x JSON calls: ``<|python_tag|>{"name": "f", "parameters": {...}}``.

``"parameters"`` replaces ``"arguments"``; several calls are separated by ``;``; the
``<|python_tag|>`` prefix is optional (Hugging Face decoding with ``skip_special_tokens=True``
drops it, vLLM keeps it) and an object using ``"parameters"`` is reported as this format with or
without it. Text after the tag that is a pythonic call (``brave_search.call(query="x")``) is
parsed as :mod:`.pythonic`. Trailing ``<|eom_id|>`` / ``<|eot_id|>`` are ignored.
"""

from __future__ import annotations

from typing import Any

from lm_eval_toolfid.core.records import SurfaceFormat
from lm_eval_toolfid.formats import pythonic
from lm_eval_toolfid.formats.calls import Found, calls_in_text
from lm_eval_toolfid.formats.common import dumps

SURFACE = SurfaceFormat.LLAMA
TAG = "<|python_tag|>"
_ENDS = ("<|eom_id|>", "<|eot_id|>")


def parse(text: str) -> tuple[Found | None, bool]:
    """``(found, pythonic_attempted)``; found is None when the tag does not appear."""
    at = text.find(TAG)
    if at == -1:
        return None, False
    body = text[at + len(TAG):].replace(TAG, " ")
    for end in _ENDS:
        body = body.replace(end, " ")
    found, attempted = pythonic.parse(body)
    if found is not None:
        return found, attempted
    return calls_in_text(body, SURFACE), attempted  # a broken object's pieces are not calls


def render(name: str, arguments: dict[str, Any], markers: bool = True) -> str:
    body = dumps({"name": name, "parameters": arguments})
    return TAG + body if markers else body


def render_many(calls: list[tuple[str, dict[str, Any]]], markers: bool = True) -> str:
    body = "; ".join(dumps({"name": n, "parameters": a}) for n, a in calls)
    return TAG + body if markers else body


RENDERERS = {"llama": render}
