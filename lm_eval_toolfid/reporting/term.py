"""Terminal niceties: the width text wraps to, wrapping (continuation lines indented), colour only on a TTY and
only without NO_COLOR."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from typing import IO

_COLOURS = {"PASS": "32;1", "FAIL": "31;1", "UNDECIDED": "33;1"}


def columns() -> int:
    """The terminal's columns (120 when not a terminal)."""
    return shutil.get_terminal_size((120, 24)).columns


def wrap_width() -> int:
    """The width text wraps to: one column short of the terminal's, at least 40."""
    return max(40, columns() - 1)


def fill(text: str, width: int | None = None) -> str:
    """``text`` wrapped to ``width`` (default :func:`wrap_width`), continuation lines indented four spaces, words
    never broken at hyphens."""
    return textwrap.fill(text, width=width or wrap_width(), subsequent_indent="    ", break_on_hyphens=False)


def use_colour(stream: IO[str] | None = None) -> bool:
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def verdict_painter(enabled: bool):
    """A cell painter for the aligned tables: colours verdict words, keeps the padding."""
    if not enabled:
        return None

    def paint(raw: str, padded: str) -> str:
        code = _COLOURS.get(raw)
        return padded.replace(raw, f"\x1b[{code}m{raw}\x1b[0m", 1) if code else padded

    return paint
