"""``toolfid gate RESULTS...``: exit 0 if every adapter passes, 1 if any fails, 2 if undecided."""

from __future__ import annotations

import argparse

from lm_eval_toolfid.reporting.gate import gate_runs


def cmd_gate(args: argparse.Namespace) -> int:
    from lm_eval_toolfid.reporting.load import load_runs

    runs, _ = load_runs(args.paths)
    return gate_runs(runs, args.junit)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gate", help="CI gate: exit 0 all pass, 1 any fail, 2 undecided; --junit for CI reports",
                       description="Exit 0 when every adapter run passes its verdict, 1 when any fails, 2 when "
                                   "some are undecided and none failed (4: bad input).")
    p.add_argument("paths", nargs="+", metavar="RESULTS", help="results files or folders (searched recursively)")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML: one testcase per adapter × gate")
    p.set_defaults(func=cmd_gate)
