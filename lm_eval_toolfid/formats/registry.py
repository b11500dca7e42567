"""The registry: every renderable format name, its module, and the surface it parses back to."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from lm_eval_toolfid.core.records import SurfaceFormat
from lm_eval_toolfid.formats import bare_json, embedded, fenced, hermes, llama, mistral, openai, pythonic, qwen_xml

Renderer = Callable[..., str]


@dataclass(frozen=True)
class Format:
    name: str
    render: Renderer
    surface: SurfaceFormat
    """The surface :func:`parse_calls` reports for this format's rendering (markers kept)."""
    surface_without_markers: SurfaceFormat
    """... and when special-token markers were dropped by the decoder."""
    has_markers: bool = False


S = SurfaceFormat
_TABLE: list[tuple[str, Renderer, SurfaceFormat, SurfaceFormat, bool]] = [
    ("bare_json", bare_json.render, S.BARE_JSON, S.BARE_JSON, False),
    ("fenced", fenced.render, S.FENCED, S.FENCED, False),
    ("embedded", embedded.render, S.EMBEDDED, S.EMBEDDED, False),
    ("hermes", hermes.render, S.HERMES, S.BARE_JSON, True),
    ("qwen_xml", qwen_xml.render, S.QWEN_XML, S.QWEN_XML, True),
    ("llama", llama.render, S.LLAMA, S.LLAMA, True),
    ("mistral", mistral.render, S.MISTRAL, S.BARE_JSON, True),
    ("mistral_args", mistral.render_args, S.MISTRAL, S.MISTRAL, True),
    ("mistral_inline", mistral.render_inline, S.MISTRAL, S.MISTRAL, True),
    ("openai", openai.render, S.OPENAI, S.OPENAI, False),
    ("openai_function", openai.render_function, S.OPENAI, S.OPENAI, False),
    ("openai_string_args", openai.render_string_args, S.OPENAI, S.OPENAI, False),
    ("pythonic", pythonic.render, S.PYTHONIC, S.PYTHONIC, False),
    ("pythonic_bare", pythonic.render_bare, S.PYTHONIC, S.PYTHONIC, False),
]

REGISTRY: dict[str, Format] = {name: Format(name, r, s, s2, m) for name, r, s, s2, m in _TABLE}
FORMATS: list[str] = list(REGISTRY)


def render_call(name: str, arguments: dict[str, Any], fmt: str, markers: bool = True) -> str:
    """One call written the way ``fmt`` writes it. ``markers=False`` gives what a decoder that
    skips special tokens shows (``<|python_tag|>``, ``[TOOL_CALLS]``, ``[ARGS]``, ``<tool_call>``
    dropped). Raises ValueError for an unknown format, or a call the format cannot express
    (pythonic needs identifier names)."""
    try:
        spec = REGISTRY[fmt]
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}") from None
    return spec.render(name, arguments, markers=markers)


Call = tuple[str, dict[str, Any]]


def _obj(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _fn(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}


def _joined(sep: str) -> Callable[[str, Sequence[Call], bool], str]:
    return lambda fmt, calls, markers: sep.join(render_call(n, a, fmt, markers) for n, a in calls)


_MANY: dict[str, Callable[[str, Sequence[Call], bool], str]] = {
    "bare_json": lambda f, calls, m: _dumps([_obj(n, a) for n, a in calls]),
    "fenced": lambda f, calls, m: "```json\n" + _dumps([_obj(n, a) for n, a in calls]) + "\n```",
    "embedded": lambda f, calls, m: "I'll call " + " and then ".join(_dumps(_obj(n, a)) for n, a in calls) + ".",
    "hermes": _joined("\n"),
    "qwen_xml": _joined("\n"),
    "llama": lambda f, calls, m: llama.render_many(list(calls), markers=m),
    "mistral": lambda f, calls, m: (mistral.MARKER if m else "") + _dumps([_obj(n, a) for n, a in calls]),
    "mistral_args": _joined(""),
    "mistral_inline": _joined(""),
    "openai": lambda f, calls, m: _dumps({"tool_calls": [
        {"id": f"call_{i}", "type": "function", "function": _fn(n, a)} for i, (n, a) in enumerate(calls)]}),
    "openai_function": lambda f, calls, m: _dumps([{"type": "function", "function": _fn(n, a)} for n, a in calls]),
    "openai_string_args": lambda f, calls, m: _dumps([_fn(n, a) for n, a in calls]),
    "pythonic": lambda f, calls, m: "[" + ", ".join(pythonic.render_bare(n, a) for n, a in calls) + "]",
}


def render_calls(calls: Sequence[Call], fmt: str, markers: bool = True) -> str:
    """Several calls in one generation, the way ``fmt`` writes parallel calls. Raises ValueError
    where the format has no way to write several calls (``pythonic_bare``) or cannot express one."""
    if len(calls) == 1:
        return render_call(calls[0][0], calls[0][1], fmt, markers)
    if fmt not in REGISTRY:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    if fmt not in _MANY:
        raise ValueError(f"format {fmt!r} writes one call per generation")
    for name, arguments in calls:
        render_call(name, arguments, fmt, markers)  # raises where a call cannot be expressed
    return _MANY[fmt](fmt, calls, markers)
