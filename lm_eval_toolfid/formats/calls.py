"""Decoded JSON values → :class:`ToolCall` objects, whatever convention the object follows.

An object is *call-shaped* when it names a function with a string (``"name"``, or
``"function"`` as a string) and carries ``"arguments"`` or ``"parameters"``. Wrappers are
unwrapped: OpenAI ``{"tool_calls": [...]}`` and ``{"function": {...}}``. Arguments that arrive
as a JSON *string* are decoded and the call flagged ``arguments_string_decoded``; a string that
does not decode to an object stays a string (scoring reports ``wrong_shape:arguments_string``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lm_eval_toolfid.core.records import SurfaceFormat, ToolCall
from lm_eval_toolfid.formats.limits import MAX_DEPTH, safe_loads
from lm_eval_toolfid.formats.scan import decoded, first_span_at

GENERIC = (SurfaceFormat.BARE_JSON, SurfaceFormat.FENCED, SurfaceFormat.EMBEDDED)
STRING_DECODED = "arguments_string_decoded"


@dataclass
class Found:
    """What one format found: call-shaped calls, and objects that are not calls."""

    calls: list[ToolCall] = field(default_factory=list)
    others: list[ToolCall] = field(default_factory=list)
    too_deep: bool = False
    """A bracket tree deeper than ``MAX_DEPTH`` was seen (and not decoded)."""
    broken: bool = False
    """JSON was found only as a piece of an outer object that does not parse (never closed, or a syntax error
    around it): a broken call, which scoring calls ``malformed``, not an object of the wrong shape."""
    broken_at: list[tuple[int, int]] = field(default_factory=list)
    """``(start, error)`` of each outer object that does not parse: where it opens and where decoding it failed."""

    def extend(self, other: Found) -> None:
        self.calls.extend(other.calls)
        self.others.extend(other.others)
        self.broken = self.broken or other.broken


def decode_string_arguments(value: str) -> Any:
    """A JSON-encoded arguments string → its object, or None when it is not one."""
    stripped = value.strip()
    if not stripped.startswith("{") or not stripped.endswith("}"):
        return None
    span = first_span_at(stripped, 0)
    if span is None or span.end != len(stripped) or span.height > MAX_DEPTH:
        return None
    ok, decoded = safe_loads(stripped)
    return decoded if ok and isinstance(decoded, dict) else None


def call_from_object(obj: dict[str, Any], container: SurfaceFormat) -> tuple[ToolCall, bool]:
    """``(call, call_shaped)`` for one decoded object."""
    convention: SurfaceFormat | None = None
    body = obj
    if isinstance(obj.get("function"), dict):
        body, convention = obj["function"], SurfaceFormat.OPENAI
    name = body.get("name")
    if name is None and isinstance(body.get("function"), str):
        name = body["function"]
    if "arguments" in body:
        has_args, arguments = True, body["arguments"]
    elif "parameters" in body:
        has_args, arguments = True, body["parameters"]
        convention = convention or SurfaceFormat.LLAMA
    else:
        has_args, arguments = False, None
    flags: tuple[str, ...] = ()
    if isinstance(arguments, str):
        decoded = decode_string_arguments(arguments)
        if decoded is not None:
            arguments, flags = decoded, (STRING_DECODED,)
            convention = SurfaceFormat.OPENAI
    surface = convention if (convention is not None and container in GENERIC) else container
    shaped = isinstance(name, str) and bool(name) and has_args
    return ToolCall(name=name, arguments=arguments, surface=surface, raw=obj, flags=flags), shaped


def calls_from_value(value: Any, container: SurfaceFormat) -> Found:
    """Calls from one decoded JSON value: an object, an array of objects, or a ``tool_calls`` wrapper."""
    found = Found()
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        items, container = value["tool_calls"], (SurfaceFormat.OPENAI if container in GENERIC else container)
    elif isinstance(value, list):
        items = value
    else:
        items = [value]
    for item in items:
        if not isinstance(item, dict):
            continue
        call, shaped = call_from_object(item, container)
        (found.calls if shaped else found.others).append(call)
    if found.calls and isinstance(value, list):
        # one array is one answer: every element was meant as a call, keep them in order
        found.calls = [call_from_object(i, container)[0] for i in items if isinstance(i, dict)]
        found.others = []
    return found


def calls_in_text(text: str, container: SurfaceFormat, start: int = 0, end: int | None = None) -> Found:
    """Calls (and other objects) from every JSON value written on its own in ``text[start:end]``.

    A value that is only a piece of an outer object that does not parse (``{"city": "Osaka"}`` of
    ``{"name": "f", "arguments": {"city": "Osaka"}``, its outer brace never closed) is neither: it sets
    :attr:`Found.broken`, and the text is a broken call, not an object of the wrong shape.
    """
    found = Found()
    too_deep: list[int] = []
    for d in decoded(text, start, end, too_deep=too_deep, broken=found.broken_at):
        part = calls_from_value(d.value, container)
        if d.fragment:
            found.broken = found.broken or bool(part.calls or part.others)
            continue
        found.extend(part)
    found.too_deep = bool(too_deep)
    return found
