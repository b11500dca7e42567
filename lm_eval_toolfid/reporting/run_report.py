"""The report of one ``toolfid run`` / ``toolfid demo`` once its views are saved: ``--json`` or the screen
(header, the engine's account under ``--verbose``, the verdict table and its notes, the breakdowns, where the
results are) and the ``--html`` file. It decides no exit code: the command does (gate, stop check)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm_eval_toolfid.reporting.load import Run, read_run
from lm_eval_toolfid.reporting.results import RunRow, row_from_results
from lm_eval_toolfid.scoring import engine_noise
from lm_eval_toolfid.scoring.engine_noise import EngineCheck


@dataclass(frozen=True)
class ReportOptions:
    """How the report is shown (``toolfid run``'s output options)."""

    task: str
    base: str
    json: bool = False
    verbose: bool = False
    breakdown: bool = True
    html: str | None = None


def report_run(options: ReportOptions, out: Path, base_view: Any, views: list[Any]) -> list[Run]:
    """Print the run's report (and write ``options.html``); returns the adapter views' saved runs, which the
    gate reads."""
    rows = [row_from_results(v.results, v.label, options.task) for v in views]
    base_row = row_from_results(base_view.results, "base", options.task)
    check = read_engine_check(out, base_view.all_samples())
    notes = engine_notes(check, views) if check is not None else {}
    if options.json:
        print(json_report(base_row, rows, check, notes))
    else:
        print_screen(options, base_row, rows)
        if check is not None:
            print_engine_check(check, notes)
    runs = [read_run(v.path) for v in views if v.path is not None]
    if not options.json and options.breakdown:
        base_runs = [read_run(base_view.path)] if base_view.path is not None else []
        print_breakdowns(_breakdown_runs(runs, rows, out), base_runs)
    if options.html:
        write_html(options.html, out)
    if not options.json:
        print(f"\nresults and per-case samples: {out}/\nreport: toolfid report {out} --html report.html")
    return runs


BREAKDOWNS = 5
"""With many adapters (:data:`~lm_eval_toolfid.reporting.screen.MANY`), the screen breaks down this many, worst first."""


def _breakdown_runs(runs: list[Run], rows: list[RunRow], out: Path) -> list[Run]:
    """The runs whose breakdown the screen prints: each, or with many adapters the worst :data:`BREAKDOWNS` that did
    not PASS (the rest: ``toolfid report``), said in one line."""
    from lm_eval_toolfid.reporting import screen

    if len(rows) < screen.MANY:
        return runs
    by_label = {run.label: run for run in runs}
    worst = [r.label for r in screen.worst_first(rows) if screen.verdict_label(r) != "PASS"][:BREAKDOWNS]
    where = f"toolfid report {out} --html report.html"
    print(f"\nbreakdowns of the {len(worst)} worst of {len(rows)} adapters (every adapter's: {where})" if worst
          else f"\nevery one of the {len(rows)} adapters passed: their breakdowns are in {where}")
    return [by_label[label] for label in worst if label in by_label]


def json_report(base_row: RunRow, rows: list[RunRow], check: EngineCheck | None = None,
                notes: dict[str, dict[str, Any]] | None = None) -> str:
    """``--json``: the base's metrics and each adapter's metrics and toolfid record; with ``--engine-check``, the
    check (``engine_check``) and, per adapter, how many of its changed cases the engine moves by itself (and
    the note its verdict gets where that is any)."""
    adapters: dict[str, Any] = {}
    for r in rows:
        entry: dict[str, Any] = {"metrics": r.metrics, **r.toolfid}
        extra = (notes or {}).get(r.label)
        if extra is not None:
            entry["engine_check"] = extra
            if extra.get("note") and isinstance(entry.get("verdict"), dict):
                entry["verdict"] = {**entry["verdict"], "notes": [*entry["verdict"].get("notes", []), extra["note"]]}
        adapters[r.label] = entry
    report: dict[str, Any] = {"base": base_row.metrics, "adapters": adapters}
    if check is not None:
        report["engine_check"] = check.to_dict()
    return json.dumps(report, indent=2, default=str)


def read_engine_check(out: Path, base_samples: list[Any]) -> EngineCheck | None:
    """``OUT/engine_check.json`` when it compared this base run (None: no check, or one of another base run)."""
    return engine_noise.read_check(out / engine_noise.FILE, engine_noise.sample_texts(base_samples))


def engine_notes(check: EngineCheck, views: list[Any]) -> dict[str, dict[str, Any]]:
    """Per adapter view: the cases it changed, how many of them the engine moves by itself, the verdict's note."""
    out: dict[str, dict[str, Any]] = {}
    for view in views:
        changed, moved = engine_noise.moved_by_engine(check, view.all_samples())
        out[view.label] = {"changed": changed, "moved_by_engine": moved,
                           "note": engine_noise.adapter_note(check, changed, moved)}
    return out


def print_engine_check(check: EngineCheck, notes: dict[str, dict[str, Any]]) -> None:
    """The engine check under the table: its line, then each adapter's note where the engine moves cases."""
    print("\n" + engine_noise.summary_line(check))
    if check.changed:
        shown = ", ".join(check.changed[:5]) + (", …" if len(check.changed) > 5 else "")
        print(f"  moved by the engine: {shown} (all in {engine_noise.FILE})")
    for label, extra in notes.items():
        if extra.get("note"):
            print(f"  {label}: {extra['note']}")


def print_screen(options: ReportOptions, base_row: RunRow, rows: list[RunRow]) -> None:
    """The verdict first (:mod:`lm_eval_toolfid.reporting.screen`): header, the engine's account under
    ``--verbose``, the table with its legend and reasons, a near-tie warning where one could change a verdict."""
    from lm_eval_toolfid.reporting import screen

    print("\n" + "\n".join(screen.header(options.task, options.base, base_row)))
    if options.verbose:  # how the tokens were obtained: the engine's account (manifests and results keep it)
        for text in (screen.generation_paths(rows, base_row), screen.verification_note([base_row, *rows])):
            if text:
                print(text)
    print()
    print(screen.paint_verdicts(screen.verdicts(rows, base_row.metric("json_valid_rate"))))
    warning = screen.near_tie_warning(rows, base_row)
    if warning:
        print(warning)


def print_breakdowns(runs: list[Run], base_runs: list[Run]) -> None:
    """Each adapter's breakdown against the base (its worst three cases)."""
    from lm_eval_toolfid.reporting.breakdown import breakdown, format_text

    for run in runs:
        b = breakdown(run, base_runs)
        if b is not None:
            print("\n" + format_text(b, worst=3))


def write_html(path: str, out: Path) -> None:
    """``--html``: the self-contained report of the run's folder."""
    from lm_eval_toolfid.core.fsutil import atomic_write_text
    from lm_eval_toolfid.reporting import collect, html

    _, board, breakdowns = collect([out])
    atomic_write_text(path, html.render(board, breakdowns))
    print(f"wrote {path}", file=sys.stderr)


def stop_check_report(views: list[tuple[str, dict[str, Any]]], task: str) -> bool:
    """``--check-stops``: one line per view on stderr; True when some case scored differently without the
    early stop (the caller exits 3)."""
    failed = False
    for label, results in views:
        meta = ((results.get("configs") or {}).get(task) or {}).get("metadata") or {}
        check = (meta.get("toolfid") or {}).get("stop_check")
        if not isinstance(check, dict):
            continue  # a view reused by --resume was checked when it ran
        if check.get("differ"):
            failed = True
            first = check["cases"][0]
            print(f"toolfid: check-stops: {label}: {check['differ']} of {check['rows']} cases score differently "
                  f"without the early stop (e.g. {first['case_id']}: {first['outcome_stopped']} stopped, "
                  f"{first['outcome_unstopped']} run on); the run's numbers are not trusted — please report it",
                  file=sys.stderr)
        elif check.get("rows"):
            print(f"toolfid: check-stops: {label}: {check['rows']} cases decoded on past the early stop; every "
                  "scored answer is the same", file=sys.stderr)
        else:
            print(f"toolfid: check-stops: {label}: {check.get('note', 'no case checked')}", file=sys.stderr)
    return failed
