"""``toolfid``: run both views in one process, print verdicts, compare and report runs, gate CI, calibrate.

Exit codes: 0 pass (or nothing to judge), 1 an adapter failed (with --gate / toolfid gate),
2 undecided and none failed, 4 input error, 5 internal error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from typing import NoReturn, Sequence

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
from lm_eval_toolfid.core.errors import EXIT_INPUT, guard

COMMANDS = (run, demo, compare, report, gate, check, power, import_bfcl, calibrate, fixtures, tasks_path, lm_eval)

DESCRIPTION = ("did a LoRA adapter keep the base model's tool-calling behaviour? Run both views in one process, "
               "compare and report runs, gate CI, calibrate.")
EPILOG = ("exit codes: 0 pass, 1 an adapter failed (--gate, gate), 2 undecided (none failed), "
          "4 input error, 5 internal error, 130 interrupted")


def _version() -> str:
    from importlib import metadata

    from lm_eval_toolfid import __version__

    try:
        return metadata.version("lm-eval-toolfid")
    except metadata.PackageNotFoundError:
        return __version__


class Parser(argparse.ArgumentParser):
    """Usage errors exit 4 (input error), not argparse's 2 (which means "undecided" here)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_INPUT, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="toolfid", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"toolfid {_version()}",
                        help="print the version and exit")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("lm-eval") if "lm-eval" in argv else len(argv)
    debug = "--debug" in argv[:cut]  # accepted anywhere before the pass-through's own arguments
    argv = [a for i, a in enumerate(argv) if not (a == "--debug" and i < cut)]
    if argv[:1] == ["lm-eval"]:  # everything after it belongs to lm_eval, flags included
        args = argparse.Namespace(func=lm_eval.cmd_lm_eval, lm_eval_args=argv[1:])
    else:
        args = build_parser().parse_args(argv)
    args.argv = argv
    return guard(lambda: args.func(args), debug=debug)


if __name__ == "__main__":
    sys.exit(main())
