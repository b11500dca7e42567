"""Reading lm-eval results back and printing the verdict table."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.scoring.metrics import DELTA_OF_RATES
from lm_eval_toolfid.scoring.verdict import label_of


@dataclass
class RunRow:
    """What the verdict table shows for one run (one adapter)."""

    label: str
    task: str
    metrics: dict[str, float]
    toolfid: dict[str, Any]

    def metric(self, name: str) -> float | None:
        value = self.metrics.get(name)
        return value if isinstance(value, (int, float)) else None

    @property
    def verdict(self) -> dict[str, Any] | None:
        return self.toolfid.get("verdict")


def row_from_results(results: dict[str, Any], label: str, task: str | None = None) -> RunRow:
    """Pull one task's metrics and toolfid provenance out of an lm-eval results dict."""
    tasks = [t for t in results.get("results", {}) if t.startswith("tool_use_fidelity")]
    if task is None:
        if not tasks:
            raise ToolfidError(f"{label}: no tool_use_fidelity results in this file")
        task = tasks[0]
    raw = results.get("results", {}).get(task)
    if raw is None:
        raise ToolfidError(f"{label}: results have no task {task!r}")
    metrics = {k.split(",")[0]: v for k, v in raw.items() if "," in k and "_stderr" not in k}
    for delta, sides in DELTA_OF_RATES.items():  # a delta with an undefined side is undefined (older files wrote
        if delta in metrics and any(not isinstance(metrics.get(s), (int, float)) for s in sides):  # 0 − base)
            metrics[delta] = None
    meta = (results.get("configs", {}).get(task, {}) or {}).get("metadata", {}) or {}
    return RunRow(label=label, task=task, metrics=metrics, toolfid=meta.get("toolfid", {}) or {})


def n_cases(results: dict[str, Any], row: RunRow) -> int:
    """How many cases a run scored (lm-eval's effective sample count, else the task's own count)."""
    counted = (results.get("n-samples", {}).get(row.task) or {}).get("effective")
    return int(counted or row.toolfid.get("n_cases") or 0)


def load_results(path: str | Path) -> dict[str, Any]:
    """An lm-eval results JSON (a file, or the newest ``results_*.json`` in a folder).

    Anything else is a one-line :class:`ToolfidError` naming the file: missing, not JSON, not
    lm-eval results, or results without a ``tool_use_fidelity`` task.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        found = sorted(p.rglob("results*.json"))
        if not found:
            raise ToolfidError(f"no results*.json under {p}; point at an lm_eval --output_path folder or file")
        p = found[-1]
    elif not p.exists():
        raise ToolfidError(f"results file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ToolfidError(f"cannot read lm-eval results {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ToolfidError(f"{p}: not an lm-eval results file (not UTF-8 text)") from None
    try:
        results = json.loads(text)
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        raise ToolfidError(f"{p}{f':{line}' if line else ''}: not valid JSON ({getattr(exc, 'msg', exc)}); "
                           f"is it a complete lm-eval results file?") from None
    except RecursionError:
        raise ToolfidError(f"{p}: JSON nests too deeply; not an lm-eval results file") from None
    if not isinstance(results, dict) or not isinstance(results.get("results"), dict):
        raise ToolfidError(f"{p}: not lm-eval results (no 'results' object); give a results_*.json from lm_eval")
    if not any(str(t).startswith("tool_use_fidelity") for t in results["results"]):
        tasks = ", ".join(sorted(map(str, results["results"]))[:5]) or "none"
        raise ToolfidError(f"{p}: no tool_use_fidelity task in these results (tasks: {tasks}); "
                           f"run lm_eval with --tasks tool_use_fidelity")
    return results


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def reason_of(row: RunRow, skip: Sequence[str] = ()) -> str:
    """The whole reason: the verdict's one line and its notes (but those in ``skip``: said elsewhere, once)."""
    verdict = row.verdict
    if not verdict:
        return row.toolfid.get("pairing", "no base reference")
    notes = [n for n in verdict.get("notes", []) if n not in skip]
    return (verdict.get("reason") or "") + (f" ({'; '.join(notes)})" if notes else "")


_reason = reason_of


_GATE_SHORT = {"validity_delta": "validity", "hallucination_delta": "halluc", "hallucination_rate": "halluc",
               "false_call_delta": "false calls", "json_valid_z": "z", "multiturn_validity_delta": "multi-turn"}


def short_reason(row: RunRow) -> str:
    """The reason in a few words, for a table cell: the failed gates (value vs threshold, clear or within
    noise), or "all gates hold", or what left it undecided."""
    verdict = row.verdict
    if not verdict:
        return "unpaired: " + str(row.toolfid.get("pairing", "no base reference")).removeprefix("none: ")
    gates = verdict.get("gates") or []
    failed = [g for g in gates if g.get("passed") is False]
    if failed:  # the values are in the table's columns; the full reason follows the table
        return ", ".join(
            _GATE_SHORT.get(g["name"], g["name"]) + {True: " (clear)", False: " (borderline)"}.get(g.get("clear"), "")
            for g in failed)
    if verdict.get("passed"):
        return "all gates hold" + ("; changed no output" if any("was it applied" in n for n in verdict.get("notes", []))
                                   else "")
    return (verdict.get("reason") or "undecided").split(";")[0]


def verdict_label(row: RunRow) -> str:
    verdict = row.verdict
    return verdict.get("label") or label_of(verdict.get("passed")) if verdict else "UNDECIDED"


def format_verdict_table(rows: list[RunRow], base_valid: float | None = None, width: int | None = None,
                 reasons: bool = True) -> str:
    """A plain-text verdict table, one line per adapter, no wider than ``width`` (default: the terminal's,
    120 when not a terminal): the ``why`` column holds the short reason, the full reasons follow the table
    (``reasons`` False: the table alone; :func:`lm_eval_toolfid.reporting.screen.verdicts` puts a legend between)."""
    from lm_eval_toolfid.reporting.term import columns

    width = width or columns()
    head = ["adapter", "valid", "base", "delta", "p(McNemar)", "halluc", "arg-diff", "parse", "z", "verdict", "why"]
    lines = []
    for r in rows:
        m = r.metric
        lines.append([
            r.label, _fmt(m("json_valid_rate")), _fmt(m("base_json_valid_rate") if m("base_json_valid_rate") is not None else base_valid),
            _fmt(m("validity_delta"), "+.3f"), _fmt(m("validity_mcnemar_p"), ".2g"), _fmt(m("hallucination_rate")),
            _fmt(m("arg_disagreement")), _fmt(m("parse_rate")), _fmt(m("json_valid_z"), "+.1f"),
            verdict_label(r), short_reason(r),
        ])
    empty = [i for i in range(1, len(head) - 2) if lines and all(line[i] == "—" for line in lines)]
    if empty:  # e.g. z without a calibration: a column of dashes says nothing and costs width
        head = [h for i, h in enumerate(head) if i not in empty]
        lines = [[c for i, c in enumerate(line) if i not in empty] for line in lines]
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(head)]
    for optional in ("base", "parse", "p(McNemar)", "arg-diff"):  # a narrow terminal: the full reasons below keep them
        if width - sum(widths[:-1]) - 2 * (len(head) - 1) - 1 >= 12 or optional not in head:
            continue
        i = head.index(optional)
        head, widths = head[:i] + head[i + 1:], widths[:i] + widths[i + 1:]
        lines = [line[:i] + line[i + 1:] for line in lines]
    room = max(12, width - sum(widths[:-1]) - 2 * (len(head) - 1) - 1)
    if widths[-1] > room:
        widths[-1] = room
        for line in lines:
            if len(line[-1]) > room:
                line[-1] = line[-1][: room - 1] + "…"
    fmt_row = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    table = [fmt_row(head), fmt_row(["-" * w for w in widths]), *map(fmt_row, lines)]
    if not reasons:
        return "\n".join(table)
    full = [f"{r.label}: {verdict_label(r)} — {_reason(r)}" for r in rows]
    return "\n".join(table) + "\n\n" + "\n".join(_wrap(line, width) for line in full)


def _wrap(text: str, width: int) -> str:
    from lm_eval_toolfid.reporting.term import fill

    return fill(text, max(40, width - 1))
