"""``parse_calls``: try the formats in order of how unambiguous their boundaries are.

1. Marker formats: ``<tool_call>`` (Hermes, or Qwen3-coder XML inside), bare ``<function=``
   (Qwen3-coder), ``[TOOL_CALLS]`` (Mistral), ``<|python_tag|>`` (Llama). The first that yields a
   call wins; one whose marker appeared but yielded nothing is recorded in
   ``malformed_formats``.
2. The whole text as JSON (bare JSON, or an OpenAI / Llama object convention).
3. Fenced code blocks (JSON or pythonic inside).
4. The whole text as a pythonic call / list of calls.
5. Mistral's inline form without markers (``f{...}``).
6. JSON embedded in prose (one linear scan, call-shaped objects preferred).

When nothing call-shaped was found but JSON objects were, and no format's markers were
attempted, those objects are returned as calls so scoring can say ``wrong_shape``. Objects that
are only pieces of an outer object that does not parse (``{"city": "Osaka"}`` of
``{"name": "get_weather", "arguments": {"city": "Osaka"}``, its outer brace never closed) are not
such objects: the text is a broken call, and scoring says ``malformed``.
"""

from __future__ import annotations

from typing import Any

from lm_eval_toolfid.core.records import ParsedGeneration, SurfaceFormat
from lm_eval_toolfid.formats import bare_json, embedded, fenced, hermes, llama, mistral, pythonic, qwen_xml
from lm_eval_toolfid.formats.calls import Found
from lm_eval_toolfid.formats.limits import SCAN_CAP, clean_text

RAISE_INTERNAL_ERRORS = False
"""Tests set this to see a parser bug instead of the never-raise safety net."""


def parse_calls(text: Any) -> ParsedGeneration:
    """Extract the tool calls a generation contains (possibly none). Never raises."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    try:
        return _parse(text)
    except Exception:  # noqa: BLE001 - the last line of defence; tests turn it off
        if RAISE_INTERNAL_ERRORS:
            raise
        return ParsedGeneration(calls=[], saw_object_start="{" in text[:SCAN_CAP])


def _parse(text: str) -> ParsedGeneration:
    text = clean_text(text[:SCAN_CAP]).strip()
    saw_start = "{" in text
    malformed: list[SurfaceFormat] = []
    others: Found | None = None

    def result(found: Found) -> ParsedGeneration:
        return ParsedGeneration(calls=found.calls, saw_object_start=saw_start, malformed_formats=tuple(malformed))

    # 1. marker formats
    if hermes.OPEN in text:
        found = hermes.parse(text)
        if found is not None and found.calls:
            return result(found)
        malformed.append(SurfaceFormat.HERMES)
    elif qwen_xml.OPEN in text:
        found = qwen_xml.parse(text)
        if found is not None and found.calls:
            return result(found)
        malformed.append(SurfaceFormat.QWEN_XML)
    if mistral.MARKER in text:
        found = mistral.parse(text)
        if found is not None and found.calls:
            return result(found)
        malformed.append(SurfaceFormat.MISTRAL)
    if llama.TAG in text:
        found, tried = llama.parse(text)
        if found is not None and found.calls:
            return result(found)
        malformed.append(SurfaceFormat.PYTHONIC if tried else SurfaceFormat.LLAMA)

    # 2.-5. whole-text formats
    found = bare_json.parse(text)
    if found is not None:
        if found.calls:
            return result(found)
        others = others or (found if found.others else None)
    found, tried = fenced.parse(text)
    if found is not None and found.calls:
        return result(found)
    if found is not None and found.others:
        others = others or found
    if tried:
        malformed.append(SurfaceFormat.PYTHONIC)
    found, tried = pythonic.parse(text)
    if found is not None and found.calls:
        return result(found)
    if tried and SurfaceFormat.PYTHONIC not in malformed:
        malformed.append(SurfaceFormat.PYTHONIC)
    found = mistral.parse_inline(text)
    if found is not None:
        return result(found)

    # 6. embedded JSON
    found = embedded.parse(text)
    if found.calls:
        return result(found)
    others = others or (found if found.others else None)
    if others is not None and not malformed and not found.too_deep and not found.broken:
        return result(Found(calls=others.others))
    return result(Found())
