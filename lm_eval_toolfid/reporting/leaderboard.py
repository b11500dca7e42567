"""The leaderboard: one row per model + adapter, grouped by base model and case set."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.reporting.load import Run, _norm

# (metric, short header, higher is better)
FIDELITY_COLUMNS: list[tuple[str, str, bool]] = [
    ("json_valid_rate", "valid", True),
    ("base_json_valid_rate", "base valid", True),
    ("validity_delta", "Δ valid", True),
    ("validity_mcnemar_p", "p McNemar", True),
    ("hallucination_rate", "halluc", False),
    ("name_hallucination_rate", "name halluc", False),
    ("hallucination_delta", "Δ halluc", False),
    ("arg_disagreement", "arg diff", False),
    ("tool_choice_change_rate", "tool change", False),
    ("identical_output_rate", "identical", True),
    ("format_drift_rate", "fmt drift", False),
    ("gold_tool_rate", "gold tool", True),
    ("gold_args_match_rate", "gold args", True),
    ("result_grounding_rate", "grounded", True),
    ("false_call_rate", "false call", False),
    ("parse_rate", "parse", True),
    ("json_valid_z", "z", True),
]
CI_IN_TABLE = ("json_valid_rate", "validity_delta")
_SIGNED = {"validity_delta", "hallucination_delta", "json_valid_z"}
_VERDICT_ORDER = {"PASS": 0, "UNDECIDED": 1, "FAIL": 2, "—": 3}
DASH = "—"


@dataclass
class LeaderboardRow:
    model: str
    adapter: str | None
    label: str
    toolfid: Run | None = None
    others: dict[str, tuple[str, float | None]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return self.toolfid.verdict_label if self.toolfid else DASH

    def metric(self, name: str) -> float | None:
        if self.toolfid is None:
            return None
        value = self.toolfid.metrics.get(name)
        return float(value) if isinstance(value, (int, float)) and value == value else None

    def ci(self, name: str) -> tuple[float, float] | None:
        return self.toolfid.ci(name) if self.toolfid else None


@dataclass
class Group:
    base: str
    case_set: str | None
    rows: list[LeaderboardRow]
    why: str = ""
    facets: dict[str, str] = field(default_factory=dict)
    """What else makes the group's runs comparable with each other (dtype, prompt, chat template, generation)."""
    differs: list[str] = field(default_factory=list)
    """The facets whose value differs between the board's groups: shown in the heading."""

    @property
    def title(self) -> str:
        cases = f"case set {self.case_set}" if self.case_set else "no tool_use_fidelity results"
        extra = "".join(f" · {name} {self.facets.get(name, DASH)}" for name in self.differs)
        return f"base {self.base} · {cases}{extra}"


FACETS = ("dtype", "backend", "prompt", "chat template", "lm-eval chat template", "generation")
"""The facets a heading names when groups differ in them (besides the base model and the case set)."""


def run_facets(run: Run) -> dict[str, str]:
    """What a run's pairing key holds besides its base model and case set, in words (a run without a key: none)."""
    prov = run.toolfid
    key = prov.get("run_key") or {}
    base = key.get("base") or {}
    generation = dict(key.get("generation") or {})
    lm_eval = generation.pop("lm_eval", None) or {}
    out = {"dtype": str(base.get("dtype") or DASH), "backend": str(base.get("backend") or DASH)}
    style = prov.get("prompt_style")
    if style:
        out["prompt"] = str(style) + (f"/{prov['prompt_template']}" if prov.get("prompt_template") else "") + \
            (f" #{key['prompt']}" if key.get("prompt") else "")
    elif key.get("prompt"):
        out["prompt"] = f"#{key['prompt']}"
    if prov.get("chat_template_sha"):
        out["chat template"] = str(prov["chat_template_sha"])[:12]
    out["lm-eval chat template"] = "applied" if lm_eval.get("apply_chat_template") else "not applied"
    if lm_eval.get("fewshot_as_multiturn"):
        out["lm-eval chat template"] += ", fewshot as multiturn"
    not_greedy = prov.get("not_greedy")
    shown = ", ".join(f"{k}={v}" for k, v in sorted(generation.items()) if k != "until")
    out["generation"] = ("NOT GREEDY: " + ", ".join(not_greedy) if not_greedy else "greedy") + \
        (f" ({shown})" if shown else "")
    return out


@dataclass
class Leaderboard:
    groups: list[Group]
    other_tasks: list[str]
    notes: list[str]

    @property
    def rows(self) -> list[LeaderboardRow]:
        return [r for g in self.groups for r in g.rows]


def build(runs: list[Run], notes: list[str] | None = None) -> Leaderboard:
    """Merge runs into rows (model + adapter [+ toolfid task]) and rows into groups (base + case set)."""
    notes = list(notes or [])
    rows: dict[tuple[Any, ...], LeaderboardRow] = {}
    others: list[Run] = []
    for run in sorted(runs, key=lambda r: (r.date or 0, str(r.source))):
        if run.toolfid_task is None:
            others.append(run)
            continue
        facets = run_facets(run)
        key = (_norm(run.model), _norm(run.adapter), run.toolfid_task, run.base_key, run.case_set,
               *(facets.get(f) for f in FACETS))
        if key in rows and rows[key].toolfid is not None:
            old = rows[key].toolfid
            notes.append(f"{run.label}: newer run {run.source} shown; older {old.source} ignored")  # type: ignore[union-attr]
        row = rows.setdefault(key, LeaderboardRow(model=run.model, adapter=run.adapter, label=run.label))
        row.toolfid, row.label = run, run.label
        row.others.update(run.other)
        row.sources.append(str(run.source))
    for run in others:  # other-task-only files join every row of the same model + adapter
        targets = [r for k, r in rows.items() if k[:2] == (_norm(run.model), _norm(run.adapter))]
        if not targets:
            key = (_norm(run.model), _norm(run.adapter), None, None, None, *(None for _ in FACETS))
            targets = [rows.setdefault(key, LeaderboardRow(model=run.model, adapter=run.adapter, label=run.label))]
        for row in targets:
            row.others.update(run.other)
            row.sources.append(str(run.source))
    groups: dict[tuple[Any, ...], Group] = {}
    for row in rows.values():
        facets: dict[str, str] = {}
        if row.toolfid is not None:
            facets = run_facets(row.toolfid)
            key = (row.toolfid.base_key, row.toolfid.case_set, *(facets.get(f) for f in FACETS))
            shown = row.toolfid.base_id
        else:
            same_model = [(k, g) for k, g in groups.items() if g.rows and _norm(g.rows[0].model) == _norm(row.model)]
            key, shown = (same_model[0][0], same_model[0][1].base) if same_model else ((row.model, None), row.model)
            facets = same_model[0][1].facets if same_model else {}
        groups.setdefault(key, Group(base=shown, case_set=key[1], rows=[], facets=facets)).rows.append(row)
    ordered = list(groups.values())
    if len(ordered) > 1:
        differs = [f for f in FACETS if len({g.facets.get(f) for g in ordered if g.facets}) > 1]
        first = ordered[0]
        for g in ordered:
            g.differs = differs
        for g in ordered[1:]:
            reasons = []
            if g.base != first.base:
                reasons.append("another base model (or the same path with other weights)")
            if g.case_set != first.case_set:
                reasons.append("another case set")
            reasons += [f"another {f} ({g.facets.get(f, DASH)})" for f in differs
                        if g.facets.get(f) != first.facets.get(f)]
            g.why = "not comparable with the first group: " + " and ".join(reasons) if reasons else ""
        first.why = (f"{len(ordered)} groups: rows are only comparable within a group (same base model, case set, "
                     "dtype, prompt and generation settings)")
    other_tasks = sorted({t for r in rows.values() for t in r.others})
    for row in rows.values():
        if not_greedy(row):
            notes.append(f"{row.label}: generated with {', '.join(not_greedy(row))} (not greedy): sampled answers "
                         "cannot show what an adapter changed, so the run has no verdict")
    return Leaderboard(groups=ordered, other_tasks=other_tasks, notes=notes)


def columns(board: Leaderboard, drop_empty: bool = True) -> list[tuple[str, str, bool]]:
    cols = FIDELITY_COLUMNS
    if drop_empty:
        cols = [c for c in cols if any(r.metric(c[0]) is not None for r in board.rows)]
    return cols


def sort_rows(board: Leaderboard, column: str | None) -> None:
    """Best first for the column (higher-is-better metrics descending); rows missing it go last."""
    if not column:
        return
    fid = {c[0]: c[2] for c in FIDELITY_COLUMNS}
    known = ["model", "adapter", "verdict", *fid, *board.other_tasks]
    if column not in known:
        raise ToolfidError(f"--sort {column}: unknown column; choose one of {', '.join(known)}")

    def key(row: LeaderboardRow) -> tuple[int, Any]:
        if column == "model":
            return (0, row.model)
        if column == "adapter":
            return (0, row.label)
        if column == "verdict":
            return (0, _VERDICT_ORDER[row.verdict])
        if column in fid:
            value = row.metric(column)
            return (1, 0.0) if value is None else (0, -value if fid[column] else value)
        value = row.others.get(column, ("", None))[1]
        return (1, 0.0) if value is None else (0, -value)  # other tasks' headline metrics: higher first

    for group in board.groups:
        group.rows.sort(key=key)


def _fmt(value: float | None, metric: str) -> str:
    if value is None:
        return DASH
    if metric == "json_valid_z":
        return f"{value:+.1f}"
    if metric == "validity_mcnemar_p":
        return f"{value:.2g}"
    return f"{value:+.3f}" if metric in _SIGNED else f"{value:.3f}"


def cell(row: LeaderboardRow, metric: str, with_ci: bool) -> str:
    text = _fmt(row.metric(metric), metric)
    ci = row.ci(metric) if with_ci and text != DASH else None
    if ci:
        signed = metric in _SIGNED
        text += f" [{ci[0]:+.2f},{ci[1]:+.2f}]" if signed else f" [{ci[0]:.2f},{ci[1]:.2f}]"
    return text


def not_greedy(row: LeaderboardRow) -> list[str]:
    """The generation settings that made this row's run sample (empty: greedy, as the contract asks)."""
    return list((row.toolfid.toolfid.get("not_greedy") or []) if row.toolfid else [])


def _adapter_name(row: LeaderboardRow) -> str:
    name = row.label if row.adapter else f"{row.label} (no adapter)" if row.label != "base" else "base (no adapter)"
    return name + (" [NOT GREEDY]" if not_greedy(row) else "")


def table_cells(board: Leaderboard, group: Group) -> tuple[list[str], list[list[str]]]:
    cols = columns(board)
    head = ["adapter", "model", *(c[1] for c in cols), "verdict", *board.other_tasks]
    body = []
    for row in group.rows:
        body.append([_adapter_name(row), Path(row.model).name or row.model,
                     *(cell(row, c[0], c[0] in CI_IN_TABLE) for c in cols), row.verdict,
                     *(_other_cell(row, t) for t in board.other_tasks)])
    return head, body


def _other_cell(row: LeaderboardRow, task: str) -> str:
    metric, value = row.others.get(task, (None, None))
    return DASH if value is None else f"{value:.3f} ({metric})"


def _aligned(head: list[str], body: list[list[str]], colour: Any = None) -> str:
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]

    def line(cells: list[str], paint: bool = False) -> str:
        out = []
        for c, w in zip(cells, widths):
            padded = c.ljust(w)
            out.append(colour(c, padded) if (paint and colour) else padded)
        return "  ".join(out).rstrip()

    return "\n".join([line(head), line(["-" * w for w in widths]), *(line(b, True) for b in body)])


def format_leaderboard_table(board: Leaderboard, colour: Any = None) -> str:
    """The leaderboard as plain text: one aligned table per group (titled where there are several groups or the
    group says why it stands apart), then the board's notes; ``colour`` paints the cells (:func:`_aligned`)."""
    parts = []
    for i, group in enumerate(board.groups):
        if len(board.groups) > 1 or group.why:
            parts.append(f"== {group.title}" + (f"\n   {group.why}" if group.why else ""))
        parts.append(_aligned(*table_cells(board, group), colour=colour))
    parts += [f"note: {n}" for n in board.notes]
    return "\n\n".join(parts)


def format_markdown(board: Leaderboard) -> str:
    def esc(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    parts = []
    for group in board.groups:
        if len(board.groups) > 1:
            parts.append(f"### {esc(group.title)}" + (f"\n\n_{esc(group.why)}_" if group.why else ""))
        head, body = table_cells(board, group)
        lines = ["| " + " | ".join(map(esc, head)) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(map(esc, b)) + " |" for b in body]
        parts.append("\n".join(lines))
    parts += [f"> note: {esc(n)}" for n in board.notes]
    return "\n\n".join(parts) + "\n"


def to_records(board: Leaderboard) -> list[dict[str, Any]]:
    out = []
    for gi, group in enumerate(board.groups):
        for row in group.rows:
            metrics = {}
            for metric, _, _ in FIDELITY_COLUMNS:
                ci = row.ci(metric)
                metrics[metric] = {"value": row.metric(metric), "ci95": list(ci) if ci else None}
            out.append({
                "group": gi, "base": group.base, "case_set": group.case_set,
                "model": row.model, "adapter": row.adapter, "label": row.label, "verdict": row.verdict,
                "verdict_reason": ((row.toolfid.verdict or {}).get("reason") if row.toolfid else None),
                "metrics": metrics, "not_greedy": not_greedy(row) or None,
                "other_tasks": {t: {"metric": m, "value": v} for t, (m, v) in row.others.items()},
                "sources": row.sources,
            })
    return out


def format_json(board: Leaderboard) -> str:
    groups = [{"base": g.base, "case_set": g.case_set, "title": g.title, "facets": g.facets, "why": g.why}
              for g in board.groups]
    return json.dumps({"groups": groups, "rows": to_records(board), "notes": board.notes}, indent=2,
                      ensure_ascii=False)


def format_csv(board: Leaderboard) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    head = ["group", "base", "case_set", "model", "adapter", "label", "verdict"]
    for metric, _, _ in FIDELITY_COLUMNS:
        head += [metric, f"{metric}_ci_low", f"{metric}_ci_high"]
    for task in board.other_tasks:
        head += [f"{task}:metric", f"{task}:value"]
    writer.writerow(head)
    for rec in to_records(board):
        line = [rec["group"], rec["base"], rec["case_set"] or "", rec["model"], rec["adapter"] or "", rec["label"],
                rec["verdict"]]
        for metric, _, _ in FIDELITY_COLUMNS:
            m = rec["metrics"][metric]
            ci = m["ci95"] or ["", ""]
            line += ["" if m["value"] is None else m["value"], *ci]
        for task in board.other_tasks:
            o = rec["other_tasks"].get(task) or {"metric": "", "value": None}
            line += [o["metric"], "" if o["value"] is None else o["value"]]
        writer.writerow(line)
    return buf.getvalue()
