"""``toolfid report RUN_OR_RESULTS...``: breakdowns in the terminal, or one self-contained HTML file."""

from __future__ import annotations

import argparse
import sys

from lm_eval_toolfid.core.fsutil import atomic_write_text


def print_breakdowns(board, breakdowns, worst: int = 3, stream=None) -> None:  # type: ignore[no-untyped-def]
    from lm_eval_toolfid.reporting.breakdown import format_text

    stream = stream or sys.stdout
    for row in board.rows:
        if row.toolfid is None or not row.adapter:
            continue
        b = breakdowns.get(str(row.toolfid.source))
        if b is not None:
            print("\n" + format_text(b, worst=worst), file=stream)
        else:
            print(f"\n{row.label}: no samples file beside {row.toolfid.source} (run lm_eval with --log_samples)",
                  file=stream)


def cmd_report(args: argparse.Namespace) -> int:
    from lm_eval_toolfid.reporting import collect, html
    from lm_eval_toolfid.reporting.leaderboard import format_leaderboard_table, sort_rows
    from lm_eval_toolfid.reporting.term import use_colour, verdict_painter

    _, board, breakdowns = collect(args.paths)
    sort_rows(board, args.sort)
    if args.html:
        atomic_write_text(args.html, html.render(board, breakdowns, title=args.title, worst=args.worst))
        print(f"wrote {args.html}", file=sys.stderr)
        if not args.terminal:
            return 0
    print(format_leaderboard_table(board, colour=verdict_painter(use_colour(sys.stdout))))
    print_breakdowns(board, breakdowns, worst=min(args.worst, 5))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="per-tool / per-outcome breakdowns and failing cases; --html for a file",
                       description="Breakdowns of toolfid runs or lm-eval results (per tool, per outcome kind, "
                                   "format drift, worst cases side by side), in the terminal or as one "
                                   "self-contained HTML file with plots.")
    p.add_argument("paths", nargs="+", metavar="RUN_OR_RESULTS", help="toolfid run folders, lm-eval output folders "
                                                                      "or results files")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report here")
    p.add_argument("--terminal", action="store_true", help="with --html, print the terminal report too")
    p.add_argument("--worst", type=int, default=20, help="failing cases shown per adapter (default %(default)s; "
                                                         "the terminal shows at most 5)")
    p.add_argument("--sort", metavar="COLUMN", help="sort the leaderboard by this column (see toolfid compare)")
    p.add_argument("--title", default="tool_use_fidelity report", help="HTML page title")
    p.set_defaults(func=cmd_report)
