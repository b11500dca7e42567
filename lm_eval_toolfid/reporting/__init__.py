"""Reading results back for people and CI: leaderboards, breakdowns, HTML, JUnit, progress."""

from __future__ import annotations

from pathlib import Path

from lm_eval_toolfid.reporting.breakdown import Breakdown, breakdown
from lm_eval_toolfid.reporting.leaderboard import Leaderboard, build
from lm_eval_toolfid.reporting.load import Run, load_runs


def collect(paths: list[str | Path]) -> tuple[list[Run], Leaderboard, dict[str, Breakdown]]:
    """Runs under ``paths``, their leaderboard, and a breakdown per run that has samples (keyed by source)."""
    runs, notes = load_runs(paths)
    board = build(runs, notes)
    base_runs = [r for r in runs if r.row is not None and not r.adapter]
    breakdowns: dict[str, Breakdown] = {}
    for run in runs:
        if run.row is not None and run.adapter:
            b = breakdown(run, base_runs)
            if b is not None:
                breakdowns[str(run.source)] = b
                ci = b.delta_ci()
                if ci is not None:
                    run.derived_ci.setdefault("validity_delta", ci)
    return runs, board, breakdowns


__all__ = ["Breakdown", "Leaderboard", "Run", "breakdown", "build", "collect", "load_runs"]
