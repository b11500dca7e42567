"""Terminal niceties: colour only on a TTY and only without NO_COLOR."""

from __future__ import annotations

import os
import sys
from typing import IO

_COLOURS = {"PASS": "32;1", "FAIL": "31;1", "UNDECIDED": "33;1"}


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
