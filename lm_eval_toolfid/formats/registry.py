"""The registry: every renderable format name, its module, and the surface it parses back to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..records import SurfaceFormat
from . import bare_json, embedded, fenced, hermes, llama, mistral, openai, pythonic, qwen_xml

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
