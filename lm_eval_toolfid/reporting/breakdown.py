"""Per-case breakdowns of one adapter run: per tool, per turn depth, per outcome kind, surface formats
per view and their drift, worst cases.

Everything comes from the lm-eval samples: each sample's ``fidelity_pass`` holds the per-case
record (``ft`` and ``base`` outcomes, the turn depth), ``doc`` has the case id, prompt and gold tool
(and, for a case set with conversations, the conversation), and ``filtered_resps`` the adapter's
text. The per-depth rows are the scoring core's own summaries of the records of each depth. The base's text comes from the base reference the run
paired with (its path is in the results' ``pairing``), or from base samples given alongside.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import PairScore, Summary
from lm_eval_toolfid.reporting.load import Run, iter_samples
from lm_eval_toolfid.scoring.metrics import MULTI_TURN, summarize_by_depth, surface_key


NO_CALL_EXPECTED = "(no call expected)"
"""The per-tool row of irrelevance cases (their ``gold_tool_name`` is empty; they may offer no tool)."""


@dataclass
class CaseRow:
    case_id: str
    prompt: str
    gold_tool: str
    ft: dict[str, Any]
    base: dict[str, Any] | None
    ft_text: str
    base_text: str | None
    turn_depth: int = 1
    conversation: str | None = None
    """A multi-turn case's request and history as text (what reports show instead of the prompt)."""

    @property
    def shown_prompt(self) -> str:
        return self.conversation or self.prompt

    @property
    def ft_valid(self) -> bool:
        return self.ft.get("kind") == "valid"

    @property
    def base_valid(self) -> bool | None:
        return None if self.base is None else self.base.get("kind") == "valid"

    @property
    def category(self) -> str:
        """Why this case is interesting, worst first."""
        if self.base_valid and not self.ft_valid:
            return "regression"
        if not self.ft_valid:
            return "invalid (base too)" if self.base is not None else "invalid"
        if self.ft.get("hallucinated"):
            return "hallucinated tool"
        if self.base_valid and self.base and self.base.get("name") != self.ft.get("name"):
            return "tool choice changed"
        if self.base is not None and not self.base_valid:
            return "improvement"
        return "ok"


_RANK = {"regression": 0, "invalid (base too)": 1, "invalid": 1, "hallucinated tool": 2, "tool choice changed": 3,
         "improvement": 5, "ok": 6}


@dataclass
class ToolRow:
    tool: str
    cases: int = 0
    base_valid: int = 0
    ft_valid: int = 0
    paired: int = 0
    """Cases with a base outcome; the delta is over these alone."""
    ft_valid_paired: int = 0

    @property
    def delta(self) -> float | None:
        """Validity rate change on this tool's paired cases (adapter − base); None when none has a base."""
        return (self.ft_valid_paired - self.base_valid) / self.paired if self.paired else None


@dataclass
class Breakdown:
    label: str
    n: int
    paired: bool
    tools: list[ToolRow]
    kinds: list[tuple[str, int, int]]  # kind[:keyword], base count, adapter count
    drift: list[tuple[str, str, int]]  # base surface, adapter surface, count
    cases: list[CaseRow] = field(default_factory=list)
    by_depth: dict[str, Summary] | None = None
    """Summaries per turn depth (``"1"``, ``"2"``, ``"3+"``, ``"2+"``) when the run has multi-turn cases."""

    def depth_rows(self) -> list[tuple[str, Summary]]:
        """The per-depth summaries, depth 1 first, the multi-turn total last."""
        return sorted((self.by_depth or {}).items(), key=lambda kv: (kv[0] == MULTI_TURN, kv[0]))
    formats: list[tuple[str, int, int]] = field(default_factory=list)
    """Per view, how cases were written (``scoring.metrics.surface_key``): key, base count, adapter count."""
    prompt: str = ""
    """The resolved prompt style (and ``auto`` when it was chosen), e.g. ``chat (auto)``."""
    expected_format: str | None = None
    """The surface format the prompt asks for (the chat template's, or bare JSON)."""

    def delta_ci(self) -> tuple[float, float] | None:
        """95% interval of the paired validity delta: mean ± 1.96 · sd/√n of the per-case differences."""
        diffs = [int(c.ft_valid) - int(bool(c.base_valid)) for c in self.cases if c.base is not None]
        if len(diffs) < 2:
            return None
        mean = sum(diffs) / len(diffs)
        var = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
        half = 1.96 * (var / len(diffs)) ** 0.5
        return max(-1.0, mean - half), min(1.0, mean + half)

    def worst(self, limit: int) -> list[CaseRow]:
        bad = [c for c in self.cases if _RANK[c.category] < 5]
        return sorted(bad, key=lambda c: (_RANK[c.category], c.case_id))[:limit]


def outcome_key(outcome: dict[str, Any] | None) -> str:
    if not outcome:
        return "—"
    kind = str(outcome.get("kind"))
    return f"{kind}:{outcome['keyword']}" if outcome.get("keyword") else kind


def explain(outcome: dict[str, Any] | None) -> str:
    """One line: what the outcome was and, if invalid, why."""
    if outcome is None:
        return "no base reference"
    key = outcome_key(outcome)
    if outcome.get("kind") == "valid":
        name = outcome.get("name")
        return f"valid call to {name}" + (" (hallucinated tool)" if outcome.get("hallucinated") else "")
    detail = outcome.get("detail")
    return f"{key}: {detail}" if detail else key


def _render_call(outcome: dict[str, Any] | None) -> str | None:
    if outcome and outcome.get("name") is not None:
        return json.dumps({"name": outcome.get("name"), "arguments": outcome.get("arguments")}, ensure_ascii=False)
    return None


def base_texts(run: Run, base_runs: list[Run]) -> dict[str, str]:
    """The base's raw generations for this run's cases, where they can be found."""
    pairing = str(run.toolfid.get("pairing") or "")
    if pairing.startswith("reference store: "):
        path = Path(pairing.split(": ", 1)[1])
        if path.is_file():
            from lm_eval_toolfid.pairing.references import read_reference

            try:
                return dict(read_reference(path).generations)
            except ToolfidError:
                pass
    for base in base_runs:
        if base.samples_path is not None and base.case_set == run.case_set and base.base_key == run.base_key:
            return {str(s.get("doc", {}).get("id")): _text(s) for s in iter_samples(base.samples_path)}
    return {}


def _text(sample: dict[str, Any]) -> str:
    resps = sample.get("filtered_resps") or sample.get("resps") or [""]
    first = resps[0]
    while isinstance(first, list) and first:
        first = first[0]
    from lm_eval_toolfid.pairing.samples import sample_prompt
    from lm_eval_toolfid.prompts.plain import restore_primer

    return restore_primer(sample_prompt(sample), first if isinstance(first, str) else json.dumps(first))


def breakdown(run: Run, base_runs: list[Run] | None = None) -> Breakdown | None:
    """None when the run has no samples file beside it."""
    if run.samples_path is None:
        return None
    texts = base_texts(run, base_runs or []) if run.adapter else {}
    cases: list[CaseRow] = []
    records: list[PairScore] = []
    for s in iter_samples(run.samples_path):
        doc = s.get("doc") or {}
        record = s.get("fidelity_pass")
        if isinstance(record, dict) and isinstance(record.get("ft"), dict):
            ft, base = record["ft"], record.get("base")
            try:
                records.append(PairScore.model_validate(record))
            except ValidationError:
                pass
        else:  # an unpaired (or base) run: rebuild the outcome line from what the sample has
            ft, base = {"kind": "valid" if s.get("json_valid_rate") == 1 else "invalid"}, None
        cid = str(doc.get("id", s.get("doc_id")))
        base_text = texts.get(cid)
        if base_text is None and isinstance(base, dict):
            base_text = _render_call(base)
        gold_tool = str(doc.get("gold_tool_name", "?")) or NO_CALL_EXPECTED
        depth = doc.get("turn_depth")
        cases.append(CaseRow(case_id=cid, prompt=str(doc.get("prompt", "")), gold_tool=gold_tool,
                             ft=ft, base=base if isinstance(base, dict) else None, ft_text=_text(s),
                             base_text=base_text, turn_depth=depth if isinstance(depth, int) else 1,
                             conversation=doc.get("conversation") or None))
    paired = any(c.base is not None for c in cases)
    tools: dict[str, ToolRow] = {}
    kinds_ft: Counter[str] = Counter()
    kinds_base: Counter[str] = Counter()
    drift: Counter[tuple[str, str]] = Counter()
    surf_ft: Counter[str] = Counter()
    surf_base: Counter[str] = Counter()
    for c in cases:
        surf_ft[surface_key(c.ft.get("kind"), c.ft.get("surface"))] += 1
        if c.base is not None:
            surf_base[surface_key(c.base.get("kind"), c.base.get("surface"))] += 1
        t = tools.setdefault(c.gold_tool, ToolRow(c.gold_tool))
        t.cases += 1
        t.ft_valid += int(c.ft_valid)
        t.base_valid += int(bool(c.base_valid))
        if c.base is not None:
            t.paired += 1
            t.ft_valid_paired += int(c.ft_valid)
        kinds_ft[outcome_key(c.ft)] += 1
        if c.base is not None:
            kinds_base[outcome_key(c.base)] += 1
            bs, fs = c.base.get("surface"), c.ft.get("surface")
            if bs and fs and bs != fs:
                drift[(bs, fs)] += 1
    kinds = sorted(((k, kinds_base.get(k, 0), kinds_ft.get(k, 0)) for k in set(kinds_ft) | set(kinds_base)),
                   key=lambda x: (-abs(x[2] - x[1]), x[0]))
    by_depth = summarize_by_depth(records) if len(records) == len(cases) else None
    formats = sorted(((k, surf_base.get(k, 0), surf_ft.get(k, 0)) for k in set(surf_ft) | set(surf_base)),
                     key=lambda x: (-max(x[1], x[2]), x[0]))
    return Breakdown(label=run.label, n=len(cases), paired=paired,
                     tools=sorted(tools.values(), key=lambda t: (t.delta is None, t.delta or 0.0, t.tool)),
                     kinds=kinds,
                     drift=[(b, f, n) for (b, f), n in drift.most_common()], cases=cases, formats=formats,
                     prompt=prompt_label(run.toolfid), expected_format=run.toolfid.get("expected_format"),
                     by_depth=by_depth)
def prompt_label(toolfid: dict[str, Any]) -> str:
    """``chat (auto)``, ``plain plain-v3`` …: the resolved style a run rendered with, from its provenance."""
    style = toolfid.get("prompt_style")
    if not style:
        return ""
    detail = toolfid.get("prompt_template") if style == "plain" else None
    requested = toolfid.get("prompt_style_requested")
    return " ".join(x for x in (style, detail, "(auto)" if requested == "auto" else None) if x)


def _clip(text: str | None, width: int) -> str:
    if text is None:
        return "(not available)"
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def depth_label(label: str) -> str:
    return "multi-turn (2+)" if label == MULTI_TURN else f"turn depth {label}"


def _rate(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _signed(x: float | None) -> str:
    return "—" if x is None else f"{x:+.2f}"


def depth_line(label: str, s: Summary) -> str:
    """One terminal line of the per-depth breakdown."""
    head = f"{depth_label(label):<16} {s.n:>4} cases"
    valid = s.get("json_valid_rate")
    if s.paired:
        delta = s.validity_delta
        text = (f"{head}  valid {_rate(s.get('base_json_valid_rate'))} → {_rate(valid)} "
                f"({'—' if delta is None else f'{delta:+.3f}'})")
    else:
        text = f"{head}  valid {_rate(valid)}"
    grounded = s.get("result_grounding_rate")
    if grounded is not None:
        text += ("; result grounding " + (f"{_rate(s.get('base_result_grounding_rate'))} → " if s.paired else "")
                 + _rate(grounded))
    return text


def _case_head(c: CaseRow) -> str:
    if c.conversation and c.turn_depth > 1:  # the end of the conversation is what the case asks about
        return f"(turn depth {c.turn_depth}) …{_tail(c.conversation, 80)}"
    return _clip(c.prompt, 90)


def _tail(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[len(flat) - width:]


def format_text(b: Breakdown, worst: int = 3, tools: int = 5) -> str:
    """A compact terminal breakdown of one adapter run."""
    lines = [f"== {b.label}: {b.n} cases" + (f", prompt {b.prompt}" if b.prompt else "")
             + ("" if b.paired else " (unpaired: adapter only)")]
    asks = f" (the prompt asks for {b.expected_format})" if b.expected_format else ""
    if b.paired:
        changed = [t for t in b.tools if t.ft_valid != t.base_valid]
        if changed:
            lines.append("  tools whose validity changed (valid cases base → adapter):")
            for t in changed[:tools]:
                lines.append(f"    {t.tool:<24} {t.base_valid:>3} → {t.ft_valid:<3} of {t.cases:<3} "
                             f"({_signed(t.delta)})")
            if len(changed) > tools:
                lines.append(f"    … {len(changed) - tools} more (see the HTML report)")
        else:
            lines.append("  per tool: validity unchanged on every tool")
        moved = [(k, bc, fc) for k, bc, fc in b.kinds if bc != fc]
        if moved:
            lines.append("  outcomes (base → adapter): " + ", ".join(f"{k} {bc}→{fc}" for k, bc, fc in moved[:6]))
        if b.formats:
            lines.append("  formats (base → adapter): " + ", ".join(f"{k} {bc}→{fc}" for k, bc, fc in b.formats[:6])
                         + asks)
        if b.drift:
            lines.append("  formats drifted: " + ", ".join(f"{bs}→{fs} ×{n}" for bs, fs, n in b.drift))
    else:
        lines.append("  outcomes: " + ", ".join(f"{k} {fc}" for k, _, fc in b.kinds))
        if b.formats:
            lines.append("  formats: " + ", ".join(f"{k} {fc}" for k, _, fc in b.formats[:6]) + asks)
    if b.by_depth:
        lines.append("  per turn depth" + (" (valid base → adapter):" if b.paired else ":"))
        lines += [f"    {depth_line(label, s)}" for label, s in b.depth_rows()]
    for c in b.worst(worst):
        lines.append(f"  [{c.category}] {c.case_id}: {_case_head(c)}")
        if c.base is not None:
            lines.append(f"      base:    {_clip(c.base_text, 70):<70}  {explain(c.base)}")
        lines.append(f"      adapter: {_clip(c.ft_text, 70):<70}  {_clip(explain(c.ft), 90)}")
    return "\n".join(lines)
