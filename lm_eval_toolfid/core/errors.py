"""The one exception type user-facing entry points turn into a one-line error, the guard every ``toolfid``
command runs under, and :data:`EXIT_CODES`: the one table of every exit code any ``toolfid`` command returns
(``toolfid --help`` prints it, :func:`exit_code_markdown` renders it for the docs).
"""

from __future__ import annotations

import contextlib
import os
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

REVISION_HINT = "toolfid run --revision R; lm_eval: revision=R in --model_args"
"""Where a hub base's revision is given, as the hub errors name it."""

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_PASS, "success (without --gate, a run that finishes exits 0 whatever its verdicts)"),
    (EXIT_FAIL, "an adapter failed its verdict (toolfid run --gate, toolfid gate); toolfid check: "
                "an answer is not what its case expects (a valid call; no call on an irrelevance case); "
                "toolfid lm-eval: lm_eval's own exit 1"),
    (EXIT_UNDECIDED, "an adapter's verdict is undecided and none failed (toolfid run --gate, toolfid gate)"),
    (EXIT_STOP_CHECK, "toolfid run --check-stops: a case scores differently without the early stop "
                      "(the run's numbers are not trusted; please report it)"),
    (EXIT_INPUT, "input error: a bad option, setting, file, model or adapter (an adapter the engine cannot run, "
                 "non-finite weights), a model the hub cannot give (offline, unreachable, unknown), a case too long "
                 "for the model's context, an --output another run is writing, a full disk; one line says what to "
                 "do"),
    (EXIT_INTERNAL, "internal error (a bug): one line; --debug shows the traceback"),
    (EXIT_SERVER, "toolfid run --server: the model server failed past its retries (a failed request is not an "
                  "answer: its view gets no metrics and no verdict); finished views are kept, --resume asks only "
                  "what failed or was not asked; under torchrun: a rank could not reach the others "
                  "(TOOLFID_RANK_TIMEOUT seconds) or lost them mid-run (each rank's finished answers are kept: "
                  "--resume)"),
    (EXIT_SERVER_AUTH, "the model server refused the key (HTTP 401/403): set OPENAI_API_KEY or --api-key-env "
                       "NAME; finished views are kept"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C); toolfid run keeps finished views for --resume"),
    (EXIT_BROKEN_PIPE, "the reader of the output went away (toolfid ... | head); nothing more is printed"),
)
"""Every exit code of every ``toolfid`` command and what it means (``toolfid lm-eval`` too: lm_eval's own usage
errors exit 4, its other exits keep their code)."""


def exit_code_text(width: int = 100) -> str:
    """:data:`EXIT_CODES` as ``toolfid --help`` prints it: ``exit codes:`` then one (wrapped) line per code."""
    import textwrap

    lines = ["exit codes:"]
    for code, meaning in EXIT_CODES:
        lines += textwrap.wrap(meaning, width=max(40, width), initial_indent=f"  {code:<5}",
                               subsequent_indent=" " * 7, break_on_hyphens=False)
    return "\n".join(lines)


def exit_code_markdown() -> str:
    """:data:`EXIT_CODES` as a Markdown table (README.md and docs/ carry this very text)."""
    rows = ["| Exit code | Meaning |", "| --- | --- |"]
    rows += ["| %d | %s |" % (code, meaning.replace("|", "\\|")) for code, meaning in EXIT_CODES]
    return "\n".join(rows)


class ToolfidError(Exception):
    """A problem with the user's input or environment, explained in one line."""

    exit_code = EXIT_USER_ERROR
    """What :func:`guard` exits with (4; a subclass may name another documented code)."""


def one_line(text: str, limit: int = 1000) -> str:
    """``text`` with line breaks folded to spaces (messages may quote user data), capped."""
    flat = " ".join(str(text).split("\n")).replace("\r", " ").replace("\u2028", " ").replace("\u2029", " ")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


_HUB_ERRORS = ("LocalEntryNotFoundError", "OfflineModeIsEnabled", "RepositoryNotFoundError", "GatedRepoError",
               "RevisionNotFoundError", "RemoteEntryNotFoundError", "EntryNotFoundError", "HfHubHTTPError")
_NETWORK_ERRORS = ("ConnectError", "TimeoutException", "NetworkError", "ConnectionError", "Timeout")
"""... which are the hub's only when raised inside ``huggingface_hub`` (a served model's connection is not)."""
_HUB_MESSAGES = ("couldn't connect to 'https://huggingface.co'", "not a valid model identifier listed on",
                 "is not a valid git identifier", "gated repo", "outgoing traffic has been disabled")


def offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set: nothing is downloaded, only the cache is read."""
    import os

    return any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in ("HF_HUB_OFFLINE",
                                                                                        "TRANSFORMERS_OFFLINE"))


def hub_problem(exc: BaseException) -> str | None:
    """What to do, in one line, when ``exc`` (or what caused it) is the Hugging Face hub failing to give a model:
    not cached while offline, unreachable, unknown, gated, a revision it does not have. None for anything else."""
    seen: set[int] = set()
    chain: list[BaseException] = []
    while exc is not None and id(exc) not in seen and len(chain) < 16:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    names = {c.__name__ for e in chain for c in type(e).__mro__}
    text = " ".join(str(e) for e in chain)
    if not (names & set(_HUB_ERRORS) or any(m in text for m in _HUB_MESSAGES)
            or names & set(_NETWORK_ERRORS) and any(_raised_in_hub(e) for e in chain)):
        return None
    if "GatedRepoError" in names or "gated repo" in text:
        return ("the model is gated on the Hugging Face hub: accept its terms on its page and log in "
                "(hf auth login), or give a local model folder")
    if "RevisionNotFoundError" in names or "is not a valid git identifier" in text:
        return ("the hub has no such revision of the model: check the revision, a branch, tag or commit "
                f"({REVISION_HINT})")
    if "RepositoryNotFoundError" in names or "not a valid model identifier listed on" in text:
        return ("no such model on the Hugging Face hub (or it is private: log in with hf auth login): check the "
                "id, or give a local model folder")
    if offline():
        return ("the model is not in the local Hugging Face cache and HF_HUB_OFFLINE=1 forbids downloading it: give "
                "a local model folder, unset HF_HUB_OFFLINE to download it, or pass the revision you have cached "
                f"({REVISION_HINT})")
    return ("the Hugging Face hub could not be reached and the model is not in the local cache: check the network "
            "(or a proxy, HF_ENDPOINT), give a local model folder, or pass the revision you have cached "
            f"({REVISION_HINT})")


def _raised_in_hub(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if "huggingface_hub" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def disk_full(exc: BaseException) -> str | None:
    """One line for a write that found no space (``ENOSPC``, or a quota: ``EDQUOT``) anywhere in ``exc``'s chain,
    naming the file and its folder's free space; None for any other error."""
    import errno
    import shutil

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            where = exc.filename or "the output"
            free = ""
            if exc.filename:
                folder = os.path.dirname(os.path.abspath(str(exc.filename)))
                with contextlib.suppress(OSError):
                    free = f" ({shutil.disk_usage(folder).free // 2**20} MiB free in {folder})"
            return (f"no space left writing {where}{free}: free some space (a view's samples take about as much "
                    "as its cases' answers, a base reference the same) and run the same command with --resume; "
                    "nothing half-written is kept")
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


def guard(func: Callable[..., int | None], *args: Any, debug: bool = False) -> int:
    """Run a CLI command; turn what it raises into a one-line message and an exit code.

    ``ToolfidError`` → ``toolfid: error: <msg>``, exit 4 (or the subclass's ``exit_code``);
    ``KeyboardInterrupt`` → exit 130; the Hugging Face hub failing to give a model (:func:`hub_problem`) → one line
    with what to do, exit 4;
    anything else → ``toolfid: internal error: <Type>: <msg> (rerun with --debug ...)``, exit 5.
    With ``debug=True`` exceptions propagate (full traceback). ``SystemExit`` passes through, but for the task's
    one-line errors raised inside lm-eval (they carry ``toolfid_exit_code``): printed, and their code returned (an
    input error is 4, never the 1 that ``--gate`` gives a failed adapter).
    """
    try:
        rc = func(*args)
    except SystemExit as exc:
        code = getattr(exc, "toolfid_exit_code", None)
        if code is None or debug:
            raise
        # the task's one-line error, raised inside lm-eval (toolfid run's views): its own code, never exit 1
        print(f"toolfid: error: {one_line(str(exc.code))}", file=sys.stderr)
        return int(code)
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
        full = disk_full(exc)
        if full is not None:  # the environment's problem, not a bug: what to do, and nothing half-written is kept
            print(f"toolfid: error: {full}", file=sys.stderr)
            return EXIT_INPUT
        hub = hub_problem(exc)
        if hub is not None:  # a user's or the network's problem, not a bug
            print(f"toolfid: error: {hub}", file=sys.stderr)
            return EXIT_INPUT
        print(f"toolfid: internal error: {type(exc).__name__}: {one_line(str(exc), 300)} "
              f"(rerun with --debug for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL_ERROR
    return 0 if rc is None else int(rc)
