"""``toolfid compare PATH...``: a leaderboard of every model + adapter found in lm-eval results."""

from __future__ import annotations

import argparse
import sys

from lm_eval_toolfid.core.fsutil import atomic_write_text

FORMATS = ("table", "markdown", "csv", "html", "json")


def render_board(board, fmt: str, breakdowns=None) -> str:  # type: ignore[no-untyped-def]
    from lm_eval_toolfid.reporting import html, leaderboard, term

    if fmt == "table":
        return leaderboard.format_leaderboard_table(board, colour=term.verdict_painter(term.use_colour(sys.stdout)))
    if fmt == "markdown":
        return leaderboard.format_markdown(board)
    if fmt == "csv":
        return leaderboard.format_csv(board)
    if fmt == "json":
        return leaderboard.format_json(board)
    return html.render(board, breakdowns or {}, title="tool_use_fidelity leaderboard")


def cmd_compare(args: argparse.Namespace) -> int:
    from lm_eval_toolfid.reporting import collect
    from lm_eval_toolfid.reporting.leaderboard import sort_rows

    _, board, breakdowns = collect(args.paths)
    sort_rows(board, args.sort)
    text = render_board(board, args.format, breakdowns if args.format == "html" else None)
    if args.output:
        atomic_write_text(args.output, text if text.endswith("\n") else text + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text.rstrip("\n"))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="leaderboard of adapters from lm-eval / toolfid results files and folders",
                       description="One row per model + adapter from lm-eval results (lm_eval --output_path "
                                   "folders, toolfid run --output folders, or results JSON files), with the "
                                   "fidelity metrics, the verdict and the headline metric of every other task.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="results files or folders (searched recursively)")
    p.add_argument("--sort", metavar="COLUMN",
                   help="sort each group by this column, best first (a metric name, a task name, "
                        "'verdict', 'adapter' or 'model')")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default %(default)s)")
    p.add_argument("--output", help="write to this file instead of stdout")
    p.set_defaults(func=cmd_compare)
