"""The one exception type user-facing entry points turn into a one-line error, and the guard that does it."""

from __future__ import annotations

import sys
from typing import Callable

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_UNDECIDED = 2
EXIT_INPUT = 4
EXIT_INTERNAL = 5
EXIT_INTERRUPTED = 130


class ToolfidError(Exception):
    """A problem with the user's input or environment, explained in one line."""


def guard(func: Callable[[], int], debug: bool = False) -> int:
    """Run a command; turn what escapes it into one line on stderr and an exit code.

    ToolfidError -> ``toolfid: error: <msg>``, exit 4; KeyboardInterrupt -> exit 130;
    anything else -> ``toolfid: internal error: ...``, exit 5. ``debug`` re-raises instead.
    """
    try:
        return func()
    except ToolfidError as exc:
        if debug:
            raise
        print(f"toolfid: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        if debug:
            raise
        print("toolfid: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the whole point: no traceback reaches a user
        if debug:
            raise
        text = " ".join(str(exc).split())[:300]
        print(f"toolfid: internal error: {type(exc).__name__}: {text} (rerun with --debug)", file=sys.stderr)
        return EXIT_INTERNAL
