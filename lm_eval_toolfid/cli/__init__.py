"""``toolfid``: run both views in one process, print verdicts, compare and report runs, gate CI, calibrate.

Exit codes: :data:`lm_eval_toolfid.core.errors.EXIT_CODES` (``toolfid --help`` prints them).
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
import warnings
from typing import NoReturn, Sequence

if (os.environ.get("WORLD_SIZE") or "1") != "1":  # under a launcher: a rank that cannot reach the others is one line
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # (exit 6), not torch's C++ retry log and stack frames

from lm_eval_toolfid.cli import (
    calibrate,
    check,
    compare,
    demo,
    fixtures,
    gate,
    import_bfcl,
    lm_eval,
    power,
    report,
    run,
    tasks_path,
)
from lm_eval_toolfid.core.errors import EXIT_INPUT, exit_code_text, guard

COMMANDS = (run, demo, compare, report, gate, check, power, import_bfcl, calibrate, fixtures, tasks_path, lm_eval)

DESCRIPTION = ("did a LoRA adapter keep the base model's tool-calling behaviour? Run both views in one process, "
               "compare and report runs, gate CI, calibrate.")


def _version() -> str:
    from importlib import metadata

    from lm_eval_toolfid import __version__

    try:
        return metadata.version("lm-eval-toolfid")
    except metadata.PackageNotFoundError:
        return __version__


class Parser(argparse.ArgumentParser):
    """Usage errors are one line (what is wrong, where the options are) and exit 4 (input error), not argparse's
    usage block and 2 (which means "undecided" here)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INPUT, f"{self.prog}: error: {message}; see {self.prog} --help\n")

    def unrecognized(self, extras: Sequence[str]) -> NoReturn:
        """One line for arguments this (sub)command does not know: the first unknown option and the closest option
        it has (``--adaptor``: did you mean ``--adapter``?), or the stray argument."""
        options = [o for a in self._actions if a.help != argparse.SUPPRESS for o in a.option_strings]
        flag = next((e for e in extras if e.startswith("-")), None)
        if flag is None:
            self.exit(EXIT_INPUT, f"{self.prog}: error: unexpected argument {extras[0]!r}; see {self.prog} --help\n")
        name = flag.split("=", 1)[0]
        self.exit(EXIT_INPUT, f"{self.prog}: error: unrecognized option {name}; {self._hint(name, options)}\n")

    def _hint(self, name: str, options: list[str]) -> str:
        """The closest option of this command; where another command's option is closer (``toolfid demo
        --adaptor``: ``--adapter`` is ``toolfid run``'s), that one, named with its command."""
        exact = [o for o in options if o == name.replace("_", "-")]
        if exact:
            return f"did you mean {exact[0]}?"
        own = _closest(name, options)
        found = [(hit, prog) for prog, opts in self.others.items() if (hit := _closest(name, opts)) is not None]
        best = max(found, key=lambda f: f[0][1], default=None)
        if best is not None and (own is None or best[0][1] > own[1]):
            option = best[0][0]
            progs = [prog for hit, prog in found if hit[0] == option]
            owners = " and ".join([", ".join(progs[:-1]), progs[-1]] if len(progs) > 1 else progs)
            return f"{option} is an option of {owners}, not of {self.prog}; see {self.prog} --help"
        return f"did you mean {own[0]}?" if own else f"see {self.prog} --help"

    others: dict[str, list[str]] = {}
    """The other commands' options, by command (set by :func:`build_parser`): a hint may name one."""


def _closest(name: str, options: list[str]) -> tuple[str, float] | None:
    """The option most like ``name`` (difflib's ratio, at least 0.6), with its ratio."""
    scored = [(o, difflib.SequenceMatcher(None, name, o).ratio()) for o in options]
    scored = [s for s in scored if s[1] >= 0.6]
    return max(scored, key=lambda s: s[1]) if scored else None


class _HubRetries(logging.Filter):
    """The Hugging Face hub's retry warnings (five of them, each printed twice, over half a minute) become one line;
    if the hub never answers, the error that follows says what to do."""

    def __init__(self) -> None:
        super().__init__()
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "thrown while requesting" not in text and not text.startswith(("Retrying in", "HTTP Error")):
            return True
        if not self.said:
            self.said = True
            print("toolfid: the Hugging Face hub does not answer; retrying for up to half a minute", file=sys.stderr)
        return False


def _epilog() -> str:
    return exit_code_text(width=78)


def build_parser() -> argparse.ArgumentParser:
    import textwrap

    parser = Parser(prog="toolfid", description=textwrap.fill(DESCRIPTION, 80), epilog=_epilog(),
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"toolfid {_version()}",
                        help="print the version and exit")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for module in COMMANDS:
        module.register(sub)
    parser.commands = sub.choices  # type: ignore[attr-defined]
    shown = {name: [o for a in command._actions if a.help != argparse.SUPPRESS for o in a.option_strings]
             for name, command in sub.choices.items()}
    for name, command in sub.choices.items():
        command.others = {f"toolfid {other}": opts for other, opts in shown.items()
                          if other not in (name, "lm-eval")}
    return parser


def _check_names(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """An unknown command or option is reported first, before argparse asks for a required option the misspelled
    one was meant to be (``--adaptor x`` is "did you mean --adapter?", not "--adapter is required")."""
    commands = parser.commands  # type: ignore[attr-defined]
    at = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if at is None:
        return
    command = commands.get(argv[at])
    if command is None:
        close = difflib.get_close_matches(argv[at], list(commands), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else "see toolfid --help"
        parser.exit(EXIT_INPUT, f"toolfid: error: unknown command {argv[at]!r}; {hint}\n")
    known = command._option_string_actions  # noqa: SLF001 - argparse keeps no public map
    for arg in argv[at + 1:]:
        if arg == "--":
            return
        if not arg.startswith("--"):
            continue
        name = arg.split("=", 1)[0]
        if name not in known and len([o for o in known if o.startswith(name)]) != 1:
            command.unrecognized([arg])


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` parsed; an option the subcommand does not know is one line naming the closest one (exit 4)."""
    parser = build_parser()
    _check_names(parser, argv)
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = parser.commands.get(getattr(args, "command", None)) or parser  # type: ignore[attr-defined]
        command.unrecognized(extras)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    hub_http = logging.getLogger("huggingface_hub.utils._http")
    if not any(isinstance(f, _HubRetries) for f in hub_http.filters):
        hub_http.addFilter(_HubRetries())
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("lm-eval") if "lm-eval" in argv else len(argv)
    debug = "--debug" in argv[:cut]  # accepted anywhere before the pass-through's own arguments
    argv = [a for i, a in enumerate(argv) if not (a == "--debug" and i < cut)]
    if argv[:1] == ["lm-eval"]:  # everything after it belongs to lm_eval, flags included
        args = argparse.Namespace(func=lm_eval.cmd_lm_eval, lm_eval_args=argv[1:])
    else:
        args = parse_args(argv)
    args.argv = argv
    return guard(lambda: args.func(args), debug=debug)


if __name__ == "__main__":
    sys.exit(main())
