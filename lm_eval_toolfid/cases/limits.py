"""How large a case may be: a line of a case file, and any one text field in it. Past these a case is refused with
``file:line`` before it is parsed further (a 50 MB prompt would otherwise pass validation and generate for
minutes); no model's context holds anywhere near that much."""

from __future__ import annotations

from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError

MAX_LINE_CHARS = 2_000_000
"""One case (one JSONL line), tools and history included."""
MAX_FIELD_CHARS = 200_000
"""One text field (a prompt, a description, an argument value): ~50,000 tokens, past every context this tool's
models have."""


def check_line_size(line: str, where: str) -> None:
    if len(line) > MAX_LINE_CHARS:
        raise ToolfidError(f"{where}: the case is {len(line):,} characters long; a case holds at most "
                           f"{MAX_LINE_CHARS:,} (no model's context is that long): shorten it")


def check_field_sizes(raw: Any, where: str, path: str = "") -> None:
    """Every string in the parsed case (keys too) within :data:`MAX_FIELD_CHARS`; the first too long is named."""
    stack: list[tuple[str, Any]] = [(path, raw)]
    while stack:
        at, value = stack.pop()
        if isinstance(value, str):
            if len(value) > MAX_FIELD_CHARS:
                raise ToolfidError(f"{where}: {at or 'a value'} is {len(value):,} characters long; a case field "
                                   f"holds at most {MAX_FIELD_CHARS:,} (no model's context is that long): shorten "
                                   "it")
        elif isinstance(value, dict):
            stack += [(f"{at}.{k}" if at else str(k), k) for k in value if isinstance(k, str)]
            stack += [(f"{at}.{k}" if at else str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(f"{at}[{i}]", v) for i, v in enumerate(value)]
