"""The one exception type user-facing entry points turn into a one-line error, and the guard
every ``toolfid`` command runs under.

Exit codes of ``toolfid`` (1 and 2 belong to the verdict gate):

====  ==========================================================
0     success
1     gate FAIL (``--gate``)
2     gate UNDECIDED
3     the stop check found a case whose scored answer depends on where generation stopped
      (``toolfid run --check-stops``: a defect of the early stop on this model; the numbers are not trusted)
4     user error (:class:`ToolfidError`): bad file, missing model, bad flag value
5     internal error (a bug): one line, ``--debug`` shows the traceback
6     the model server failed past its retries (``toolfid run --server``): finished views and the answers of the
      stopped view are kept; ``--resume`` continues
7     the model server refused the key (HTTP 401/403; ``toolfid run --server``, ``toolfid lm-eval --model
      toolfid-server``): set ``OPENAI_API_KEY`` or ``--api-key-env NAME``; finished views are kept
130   interrupted (Ctrl-C)
141   the reader of the output went away (``toolfid ... | head``); nothing more is printed
====  ==========================================================
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_UNDECIDED = 2
EXIT_STOP_CHECK = 3
EXIT_USER_ERROR = EXIT_INPUT = 4
EXIT_INTERNAL_ERROR = EXIT_INTERNAL = 5
EXIT_SERVER = 6
EXIT_SERVER_AUTH = 7
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: the process reading our output closed it (``| head``)."""


class ToolfidError(Exception):
    """A problem with the user's input or environment, explained in one line."""

    exit_code = EXIT_USER_ERROR
    """What :func:`guard` exits with (4; a subclass may name another documented code)."""


def one_line(text: str, limit: int = 1000) -> str:
    """``text`` with line breaks folded to spaces (messages may quote user data), capped."""
    flat = " ".join(str(text).split("\n")).replace("\r", " ").replace("\u2028", " ").replace("\u2029", " ")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def guard(func: Callable[..., int | None], *args: Any, debug: bool = False) -> int:
    """Run a CLI command; turn what it raises into a one-line message and an exit code.

    ``ToolfidError`` → ``toolfid: error: <msg>``, exit 4 (or the subclass's ``exit_code``);
    ``KeyboardInterrupt`` → exit 130;
    anything else → ``toolfid: internal error: <Type>: <msg> (rerun with --debug ...)``, exit 5.
    With ``debug=True`` exceptions propagate (full traceback). ``SystemExit`` always passes through.
    """
    try:
        rc = func(*args)
    except SystemExit:
        raise
    except BrokenPipeError:  # `toolfid ... | head`: the reader left; stop quietly, as Unix tools do
        import os

        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except BaseException as exc:  # noqa: BLE001 - this is the top level
        if debug:
            raise
        if isinstance(exc, ToolfidError):
            print(f"toolfid: error: {one_line(str(exc))}", file=sys.stderr)
            return int(exc.exit_code)
        if isinstance(exc, KeyboardInterrupt):
            print("toolfid: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        if not isinstance(exc, Exception):  # GeneratorExit and the like: not ours to swallow
            raise
        print(f"toolfid: internal error: {type(exc).__name__}: {one_line(str(exc), 300)} "
              f"(rerun with --debug for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL_ERROR
    return 0 if rc is None else int(rc)
