"""Pythonic calls: ``[get_weather(city="Paris"), get_time(tz="UTC")]`` or bare ``f(a=1)``.

Parsed with :func:`ast.parse` and converted by walking the tree: NOTHING is ever evaluated.
Only keyword arguments with literal values count: strings, numbers (also negative), True /
False / None (and JSON's true / false / null), nested lists, tuples (→ lists) and dicts with
string keys. Dotted names (``math.sum(...)``) are allowed. Anything else — positional
arguments, ``**kwargs``, names, calls such as ``__import__('os')``, arithmetic, sets, bytes,
complex or non-finite numbers — makes the text an attempted but malformed call. Texts longer
than ``PYTHONIC_CAP`` are not parsed; ``ast`` errors of any kind (SyntaxError, RecursionError,
MemoryError, ValueError for huge int literals) count as malformed.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

from lm_eval_toolfid.core.records import SurfaceFormat, ToolCall
from lm_eval_toolfid.formats.calls import Found
from lm_eval_toolfid.formats.limits import MAX_DEPTH, PYTHONIC_CAP, clean_text

SURFACE = SurfaceFormat.PYTHONIC
_LOOKS_LIKE = re.compile(r"\[?\s*[A-Za-z_][\w.]*\(")
_JSON_NAMES = {"true": True, "false": False, "null": None}


class NotLiteral(Exception):
    """The tree holds something that is not a plain literal."""


def looks_like(text: str) -> bool:
    """The text starts like a pythonic call (``f(`` or ``[f(``)."""
    return _LOOKS_LIKE.match(text) is not None


def parse(text: str) -> tuple[Found | None, bool]:
    """``(found, attempted)``: found is None unless the whole text is a call or a list of calls."""
    text = text.strip()
    if not looks_like(text):
        return None, False
    if len(text) > PYTHONIC_CAP:
        return None, True
    try:
        tree = ast.parse(text, mode="eval")
        calls = _calls(tree.body)
    except (NotLiteral, SyntaxError, RecursionError, MemoryError, ValueError, TypeError, OverflowError):
        return None, True
    return Found(calls=calls), True


def _calls(node: ast.AST) -> list[ToolCall]:
    nodes = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    if not nodes:
        raise NotLiteral("empty list")
    out = []
    for call in nodes:
        if not isinstance(call, ast.Call):
            raise NotLiteral("not a call")
        name = _dotted(call.func)
        if call.args:
            raise NotLiteral("positional arguments")
        arguments: dict[str, Any] = {}
        for kw in call.keywords:
            if kw.arg is None:
                raise NotLiteral("**kwargs")
            if kw.arg in arguments:
                raise NotLiteral("repeated keyword argument")  # Python itself refuses this
            arguments[kw.arg] = _literal(kw.value, MAX_DEPTH)
        out.append(ToolCall(name=name, arguments=arguments, surface=SURFACE,
                            raw={"name": name, "arguments": arguments}))
    return out


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise NotLiteral("function name")
    parts.append(node.id)
    return ".".join(reversed(parts))


def _number(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise NotLiteral("non-finite")
        return node.value
    raise NotLiteral("not a number")


def _literal(node: ast.AST, depth: int) -> Any:
    if depth <= 0:
        raise NotLiteral("too deep")
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, (bool, str)):
            return clean_text(value) if isinstance(value, str) else value
        return _number(node)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _number(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e, depth - 1) for e in node.elts]
    if isinstance(node, ast.Dict):
        out: dict[str, Any] = {}
        for k, v in zip(node.keys, node.values):
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                raise NotLiteral("dict key")
            out[clean_text(k.value)] = _literal(v, depth - 1)
        return out
    raise NotLiteral(type(node).__name__)


def py_literal(value: Any) -> str:
    """Python source for a JSON value (the inverse of the conversion above)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float, str)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py_literal(str(k))}: {py_literal(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"not a JSON value: {type(value).__name__}")


def expressible(name: str, arguments: dict[str, Any]) -> bool:
    """Whether a call can be written pythonically (names must be identifiers, not keywords)."""
    import keyword
    parts = name.split(".")
    return all(p.isidentifier() and not keyword.iskeyword(p) for p in parts) and all(
        isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) for k in arguments)


def _one(name: str, arguments: dict[str, Any]) -> str:
    if not expressible(name, arguments):
        raise ValueError(f"{name!r} with arguments {sorted(arguments)} cannot be written as a Python call")
    return f"{name}(" + ", ".join(f"{k}={py_literal(v)}" for k, v in arguments.items()) + ")"


def render(name: str, arguments: dict[str, Any], markers: bool = True) -> str:
    return "[" + _one(name, arguments) + "]"


def render_bare(name: str, arguments: dict[str, Any], markers: bool = True) -> str:
    return _one(name, arguments)


RENDERERS = {"pythonic": render, "pythonic_bare": render_bare}
