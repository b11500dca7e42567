"""One self-contained HTML report: leaderboard, plots (inline SVG), breakdowns, failing cases.

No scripts, no external resources: it opens offline, prints, and model output (untrusted) is
HTML-escaped everywhere it appears.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from lm_eval_toolfid import __version__
from lm_eval_toolfid.reporting.breakdown import Breakdown, depth_label, explain
from lm_eval_toolfid.reporting.leaderboard import Group, Leaderboard, LeaderboardRow, table_cells
from lm_eval_toolfid.reporting.svg import esc, grouped_bars, heatmap, interval_rows, null_strip

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ccc}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0;font-size:12px}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3}
.PASS{background:#d9f2d9;font-weight:bold}.FAIL{background:#f8d0d0;font-weight:bold}
.UNDECIDED{background:#fff2c2;font-weight:bold}
pre{white-space:pre-wrap;word-break:break-word;margin:0;font-size:11px;max-width:420px}
.plots{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
.note{color:#555;font-size:12px}
.regression{color:#b00;font-weight:bold}
@media print{body{margin:0}.plots{display:block}h2{page-break-before:auto}}
"""


def _verdict_cell(label: str) -> str:
    return f'<td class="{esc(label)}">{esc(label)}</td>'


def leaderboard_table(board: Leaderboard, group: Group) -> str:
    head, body = table_cells(board, group)
    vi = head.index("verdict")
    out = ["<table class=\"leaderboard\"><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for row, cells in zip(group.rows, body):
        tds = [(_verdict_cell(c) if i == vi else f"<td>{esc(c)}</td>") for i, c in enumerate(cells)]
        reason = (row.toolfid.verdict or {}).get("reason") if row.toolfid else None
        out.append(f"<tr title=\"{esc(reason or '')}\">" + "".join(tds) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _adapter_rows(group: Group) -> list[LeaderboardRow]:
    return [r for r in group.rows if r.toolfid is not None and r.adapter]


def validity_plot(group: Group) -> str | None:
    rows = [r for r in _adapter_rows(group) if r.metric("json_valid_rate") is not None]
    if not rows:
        return None
    cats = [r.label for r in rows]
    return grouped_bars("JSON validity: base vs adapter (95% CI)", cats, [
        ("base", [r.metric("base_json_valid_rate") for r in rows], [r.ci("base_json_valid_rate") for r in rows]),
        ("adapter", [r.metric("json_valid_rate") for r in rows], [r.ci("json_valid_rate") for r in rows]),
    ])


def delta_plot(group: Group) -> str | None:
    """Each adapter's validity delta with its interval: bars for a few adapters, one row each, worst first, for
    many (:data:`~lm_eval_toolfid.reporting.screen.MANY`)."""
    from lm_eval_toolfid.reporting.screen import MANY

    rows = [r for r in _adapter_rows(group) if r.metric("validity_delta") is not None]
    if not rows:
        return None
    if len(rows) >= MANY:
        rows = sorted(rows, key=lambda r: (r.metric("validity_delta"), r.label))
        floors = {g.get("threshold") for r in rows for g in ((r.toolfid.verdict or {}).get("gates") or [])
                  if g.get("name") == "validity_delta" and isinstance(g.get("threshold"), (int, float))}
        marks = [("0", 0.0), *((f"floor {f:g}", float(f)) for f in sorted(floors)[:1])]
        return interval_rows(f"validity delta, adapter − base (95% CI), {len(rows)} adapters, worst first",
                             [r.label for r in rows], [r.metric("validity_delta") for r in rows],
                             [r.ci("validity_delta") for r in rows], marks=marks)
    return grouped_bars("validity delta, adapter − base (95% CI)", [r.label for r in rows], [
        ("validity_delta", [r.metric("validity_delta") for r in rows], [r.ci("validity_delta") for r in rows]),
    ], lo=-1.0, hi=1.0)


DEPTH_SERIES = ("1", "2", "3+")


def _by_depth(row: LeaderboardRow) -> dict[str, dict]:
    found = ((row.toolfid.toolfid.get("summary") or {}).get("by_depth") if row.toolfid else None) or {}
    return found if isinstance(found, dict) else {}


def _ci(value: object) -> tuple[float, float] | None:
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(x, (int, float)) for x in value):
        return float(value[0]), float(value[1])
    return None


def depth_plot(group: Group) -> str | None:
    """Validity delta per turn depth (adapter − base, 95% CI), from each run's per-depth summaries."""
    rows = [r for r in _adapter_rows(group) if any((_by_depth(r).get(d) or {}).get("paired") for d in DEPTH_SERIES)]
    if not rows:
        return None
    series = []
    for d in DEPTH_SERIES:
        subs = [_by_depth(r).get(d) or {} for r in rows]
        if any(subs):
            series.append((depth_label(d), [(s.get("metrics") or {}).get("validity_delta") for s in subs],
                           [_ci(s.get("validity_delta_ci")) for s in subs]))
    return grouped_bars("validity delta per turn depth (95% CI)", [r.label for r in rows], series, lo=-1.0, hi=1.0)


BEHAVIOUR_METRICS = ("hallucination_rate", "name_hallucination_rate", "tool_choice_change_rate", "gold_tool_rate",
                     "arg_disagreement", "format_drift_rate")


def behaviour_plot(group: Group) -> str | None:
    rows = _adapter_rows(group)
    present = [m for m in BEHAVIOUR_METRICS if any(r.metric(m) is not None for r in rows)]
    if not rows or not present:
        return None
    return grouped_bars("hallucination and tool choice", [r.label for r in rows],
                        [(m, [r.metric(m) for r in rows], [r.ci(m) for r in rows]) for m in present])


def _null_values(path: str) -> tuple[list[float], str] | None:
    try:
        data = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list):
        return None
    values = [float(r["metrics"]["json_valid_rate"]) for r in runs
              if isinstance(r, dict) and float(r.get("multiplier", 0)) == 1.0
              and isinstance((r.get("metrics") or {}).get("json_valid_rate"), (int, float))]
    return values, path


def null_plots(group: Group) -> list[str]:
    """One strip per calibration file used in the group; without the file, the stored z profile."""
    by_cal: dict[str, list[LeaderboardRow]] = {}
    for row in _adapter_rows(group):
        cal = row.toolfid.toolfid.get("calibration") if row.toolfid else None
        if cal:
            by_cal.setdefault(str(cal), []).append(row)
    out = []
    for cal, rows in by_cal.items():
        marks = [(r.label, r.metric("json_valid_rate")) for r in rows if r.metric("json_valid_rate") is not None]
        found = _null_values(cal)
        if found and found[0]:
            out.append(null_strip(f"null distribution of json_valid_rate (×1, {len(found[0])} runs) vs adapters",
                                  found[0], marks))  # type: ignore[arg-type]
            continue
        profiles = [(r.label, r.toolfid.toolfid.get("z_profile")) for r in rows if r.toolfid]
        lines = "".join(f"<tr><td>{esc(label)}</td><td>{esc(json.dumps(p))}</td></tr>" for label, p in profiles if p)
        out.append(f'<div class="note">calibration file {esc(cal)} not readable here; z profile from the results:'
                   f"<table><tr><th>adapter</th><th>z per null multiplier</th></tr>{lines}</table></div>")
    return out


def tool_heatmap(group: Group, breakdowns: dict[str, Breakdown]) -> str | None:
    rows = [r for r in _adapter_rows(group) if r.toolfid and str(r.toolfid.source) in breakdowns]
    bds = [breakdowns[str(r.toolfid.source)] for r in rows if r.toolfid]
    bds = [b for b in bds if b.paired]
    if not bds:
        return None
    tools = sorted({t.tool for b in bds for t in b.tools})
    per = [{t.tool: t.delta for t in b.tools} for b in bds]
    # the tools that changed most first, at most 40 rows
    tools.sort(key=lambda t: (min((p.get(t) or 0.0 for p in per), default=0.0), t))
    tools = tools[:40]
    return heatmap("validity change per tool (adapter − base)", tools, [b.label for b in bds],
                   [[p.get(t) for p in per] for t in tools])


def _cell(x: float | None, signed: bool = False, digits: int = 3) -> str:
    return "—" if x is None else (f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}")


def depth_table(b: Breakdown) -> str:
    """Per turn depth: cases, validity base/adapter and delta, result grounding, gold values."""
    out = ['<table class="depths"><tr><th>turn depth</th><th>cases</th><th>base valid</th><th>adapter valid</th>'
           "<th>Δ valid (95% CI)</th><th>base grounded</th><th>adapter grounded</th><th>gold args</th></tr>"]
    for label, s in b.depth_rows():
        ci = s.validity_delta_ci
        delta = _cell(s.validity_delta, signed=True) + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")
        cls = ' class="regression"' if s.validity_delta is not None and s.validity_delta < -0.05 else ""
        out.append(f"<tr><td>{esc(depth_label(label))}</td><td>{s.n}</td>"
                   f"<td>{_cell(s.get('base_json_valid_rate'))}</td><td>{_cell(s.get('json_valid_rate'))}</td>"
                   f"<td{cls}>{esc(delta)}</td><td>{_cell(s.get('base_result_grounding_rate'))}</td>"
                   f"<td>{_cell(s.get('result_grounding_rate'))}</td><td>{_cell(s.get('gold_args_match_rate'))}</td></tr>")
    out.append("</table>")
    return "".join(out)


def breakdown_section(b: Breakdown, worst: int) -> str:
    prompt = f", prompt {esc(b.prompt)}" if b.prompt else ""
    out = [f"<h3>{esc(b.label)}: {b.n} cases{prompt}{'' if b.paired else ' (unpaired)'}</h3>"]
    if b.by_depth:
        out.append(depth_table(b))
    if b.paired:
        changed = [t for t in b.tools if t.ft_valid != t.base_valid]
        out.append("<table><tr><th>tool</th><th>cases</th><th>base valid</th><th>adapter valid</th><th>Δ rate</th></tr>")
        for t in (changed or b.tools)[:25]:
            out.append(f"<tr><td>{esc(t.tool)}</td><td>{t.cases}</td><td>{t.base_valid}</td><td>{t.ft_valid}</td>"
                       f"<td>{_cell(t.delta, signed=True, digits=2)}</td></tr>")
        out.append("</table>")
        if not changed:
            out.append('<p class="note">validity unchanged on every tool</p>')
    out.append("<table><tr><th>outcome</th><th>base</th><th>adapter</th><th>Δ</th></tr>")
    for kind, bc, fc in b.kinds:
        out.append(f"<tr><td>{esc(kind)}</td><td>{bc if b.paired else '—'}</td><td>{fc}</td>"
                   f"<td>{fc - bc:+d}</td></tr>" if b.paired else
                   f"<tr><td>{esc(kind)}</td><td>—</td><td>{fc}</td><td>—</td></tr>")
    out.append("</table>")
    if b.formats:
        asks = f" (the prompt asks for {esc(b.expected_format)})" if b.expected_format else ""
        out.append("<p>formats" + (" (base → adapter): " if b.paired else ": ")
                   + ", ".join(f"{esc(k)} {bc}→{fc}" if b.paired else f"{esc(k)} {fc}" for k, bc, fc in b.formats)
                   + asks + "</p>")
    if b.drift:
        out.append("<p>formats drifted: " + ", ".join(f"{esc(bs)} → {esc(fs)} ×{n}" for bs, fs, n in b.drift) + "</p>")
    cases = b.worst(worst)
    if cases:
        out.append('<table class="cases"><tr><th>case</th><th>prompt</th><th>base output</th><th>base: why</th>'
                   "<th>adapter output</th><th>adapter: why</th></tr>")
        for c in cases:
            cls = ' class="regression"' if c.category == "regression" else ""
            depth = f"<br>turn depth {c.turn_depth}" if c.turn_depth > 1 else ""
            out.append(f"<tr><td{cls}>{esc(c.case_id)}<br>{esc(c.category)}{depth}</td>"
                       f"<td><pre>{esc(c.shown_prompt)}</pre></td>"
                       f"<td><pre>{esc(c.base_text if c.base_text is not None else '(not available)')}</pre></td>"
                       f"<td>{esc(explain(c.base))}</td><td><pre>{esc(c.ft_text)}</pre></td>"
                       f"<td>{esc(explain(c.ft))}</td></tr>")
        out.append("</table>")
    else:
        out.append('<p class="note">no failing cases</p>')
    return "".join(out)


def render(board: Leaderboard, breakdowns: dict[str, Breakdown], title: str = "tool_use_fidelity report",
           worst: int = 20) -> str:
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{esc(title)}</title>"
             f"<style>{CSS}</style></head><body><h1>{esc(title)}</h1>"
             f"<p class=\"note\">lm-eval-toolfid {esc(__version__)} · generated "
             f"{esc(time.strftime('%Y-%m-%d %H:%M:%S %Z'))}</p>"]
    for gi, group in enumerate(board.groups):
        parts.append(f"<h2>{esc(group.title)}</h2>")
        if group.why:
            parts.append(f'<p class="note">{esc(group.why)}</p>')
        parts.append(leaderboard_table(board, group))
        plots = [p for p in (validity_plot(group), delta_plot(group), depth_plot(group), behaviour_plot(group)) if p]
        plots += null_plots(group)
        hm = tool_heatmap(group, breakdowns)
        if hm:
            plots.append(hm)
        if plots:
            parts.append('<div class="plots">' + "".join(f"<figure>{p}</figure>" for p in plots) + "</div>")
        for row in group.rows:
            if row.toolfid is None:
                continue
            verdict = row.toolfid.verdict or {}
            gates = verdict.get("gates") or []
            if gates:
                parts.append(f"<h3>{esc(row.label)}: verdict {esc(row.verdict)}</h3><table><tr><th>gate</th>"
                             "<th>value</th><th>limit</th><th>result</th><th>note</th></tr>")
                for g in gates:
                    res = {True: "PASS", False: "FAIL", None: "UNDECIDED"}.get(g.get("passed"), "UNDECIDED")
                    value = g.get("value")
                    result = (_verdict_cell(res) if g.get("measured", True) is not False
                              else '<td class="UNDECIDED">not measured</td>')
                    parts.append(f"<tr><td>{esc(g.get('name'))}</td><td>{esc('—' if value is None else f'{value:+.3f}')}"
                                 f"</td><td>{esc(g.get('op'))} {esc(g.get('threshold'))}</td>{result}"
                                 f"<td>{esc(g.get('note', ''))}</td></tr>")
                parts.append("</table>")
                for note in verdict.get("notes") or []:
                    parts.append(f'<p class="note">{esc(note)}</p>')
            bd = breakdowns.get(str(row.toolfid.source))
            if bd is not None and row.adapter:
                parts.append(breakdown_section(bd, worst))
    for note in board.notes:
        parts.append(f'<p class="note">note: {esc(note)}</p>')
    parts.append("</body></html>\n")
    return "".join(parts)
