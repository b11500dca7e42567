"""What ``toolfid run`` / ``toolfid demo`` print on the terminal: the verdict first.

One header line (task, base, cases, prompt style; a second only to say why ``prompt_style: auto`` chose what it
chose), the verdict table, a legend saying which columns are gated and what ``halluc`` and ``arg-diff`` are, one
line per adapter with its reasons (a note every adapter shares said once), a one-line warning where near ties
could change a verdict, then where the results are. How the views' tokens were obtained (verification, drafting,
views decoded together, near ties) is the engine's business: :func:`generation_paths` and
:func:`verification_note` print it under ``--verbose`` only (the manifests, results and HTML report record it).
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any, Sequence

from lm_eval_toolfid.reporting.results import RunRow, format_verdict_table, reason_of, verdict_label
from lm_eval_toolfid.reporting.term import fill as _fill


def header(task: str, base: str, base_row: RunRow) -> list[str]:
    """The lines above the table: task, base, cases, prompt style (and the base's validity) in one; with
    ``prompt_style: auto``, a second saying why it chose what it chose."""
    from lm_eval_toolfid.reporting.breakdown import prompt_label

    t = base_row.toolfid
    valid = base_row.metric("json_valid_rate")
    prompt = prompt_label(t)
    lines = [f"{task} — base {base}: {t.get('n_cases')} cases{f', prompt {prompt}' if prompt else ''} "
             f"(base json_valid_rate {'—' if valid is None else f'{valid:.3f}'})"]
    if t.get("prompt_style_requested") == "auto" and t.get("prompt_style_reason"):
        lines.append(f"prompt_style auto -> {t.get('prompt_style')}: {t.get('prompt_style_reason')}")
    return lines


def _threshold(rows: Sequence[RunRow], name: str, default: float) -> float:
    for row in rows:
        for gate in (row.verdict or {}).get("gates") or []:
            if gate.get("name") == name and isinstance(gate.get("threshold"), (int, float)):
                return float(gate["threshold"])
    return default


def legend(rows: Sequence[RunRow], width: int | None = None) -> str:
    """Under the table: which columns the verdict is gated on, what the others are, and what the words of the
    ``why`` column mean."""
    gates = {g.get("name") for row in rows for g in (row.verdict or {}).get("gates") or []}
    floor = _threshold(rows, "validity_delta", -0.05)
    absolute = "hallucination_rate" in gates
    cap = _threshold(rows, "hallucination_rate" if absolute else "hallucination_delta", 0.10)
    also = [what for name, what in (("multiturn_validity_delta", "delta on the multi-turn cases alone"),
                                    ("false_call_delta", "false calls on cases that expect none"),
                                    ("json_valid_z", f"z (≥ {_threshold(rows, 'json_valid_z', 3.0):g})"))
            if name in gates]
    halluc = (f"halluc ≤ {cap:.2f}" if absolute else f"the change in halluc from the base's (≤ +{cap:.2f})")
    not_gated = ["p(McNemar)", "halluc itself" if not absolute else "", "arg-diff", "parse"]
    text = (f"gated: delta (valid − base ≥ {floor:+.2f}) and {halluc}" + "".join(f", {a}" for a in also)
            + f"; not gated: {', '.join(c for c in not_gated if c)}. halluc: share of valid answers that call a tool "
              "not offered; arg-diff: share of argument values that differ from the base's (where both are valid); "
              "parse: share of answers that parse as a call. why: (clear) the 95% CI is wholly past the "
              "threshold, (borderline) only the estimate is — a FAIL either way.")
    return _fill(text, width)


def shared_notes(rows: Sequence[RunRow]) -> list[str]:
    """The verdict notes every adapter has (said once, under the reasons) — only with more than one adapter."""
    if len(rows) < 2:
        return []
    notes = [list((row.verdict or {}).get("notes") or []) for row in rows]
    return [n for n in notes[0] if all(n in other for other in notes[1:])]


MANY = 12
"""From this many adapters on, the screen lists them worst first and gives reasons for those that did not PASS only."""
_RANK = {"FAIL": 0, "UNDECIDED": 1, "PASS": 2}


def worst_first(rows: Sequence[RunRow]) -> list[RunRow]:
    """FAIL, then UNDECIDED, then PASS; within each, the largest validity drop first (no delta last), then by label."""
    def key(row: RunRow) -> tuple[int, float, str]:
        delta = row.metric("validity_delta")
        return (_RANK.get(verdict_label(row), 1), delta if delta is not None else float("inf"), row.label)

    return sorted(rows, key=key)


def reasons(rows: Sequence[RunRow], width: int | None = None) -> str:
    """One line (wrapped) per adapter: its verdict and why, without the notes every adapter shares; those follow
    once. With :data:`MANY` adapters or more, the adapters that PASS are named on one line instead of one each."""
    shared = shared_notes(rows)
    many = len(rows) >= MANY
    told = [r for r in rows if not many or verdict_label(r) != "PASS"]
    lines = [_fill(f"{r.label}: {verdict_label(r)} — {reason_of(r, skip=shared)}", width) for r in told]
    passed = [r.label for r in rows if r not in told]
    if passed:
        lines.append(_fill(f"PASS ({len(passed)}): {', '.join(passed)} (each one's reasons: toolfid report, or --json)",
                           width))
    if shared:
        lines.append(_fill(f"(every adapter: {'; '.join(shared)})", width))
    return "\n".join(lines)


def verdicts(rows: Sequence[RunRow], base_valid: float | None = None, width: int | None = None) -> str:
    """The table, its legend, the reasons; with :data:`MANY` adapters or more, worst first."""
    rows = worst_first(rows) if len(rows) >= MANY else list(rows)
    table = format_verdict_table(list(rows), base_valid, width=width, reasons=False)
    return f"{table}\n{legend(rows, width)}\n\n{reasons(rows, width)}"


_TIES = (("near_tie_cases", "--no-verify"), ("prefix_near_tie_cases", "--no-prefix-cache"),
         ("joint_near_tie_cases", "--views-together 1"), ("lora_near_tie_cases", "lm_eval --model hf ... peft="))


def _tie_cases(row: Any) -> tuple[int, set[str]]:
    gen = (row.toolfid or {}).get("generation") or {}
    cases, flags = 0, set()
    for key, flag in _TIES:
        n = gen.get(key) or 0
        if n:
            cases += int(n)
            flags.add(flag)
    return cases, flags


_GATE_DENOMINATOR = {"validity_delta": "json_valid_rate", "hallucination_delta": "hallucination_rate",
                     "hallucination_rate": "hallucination_rate", "false_call_delta": "false_call_rate"}
_OVER = re.compile(r"over (?:only )?(\d+) ")


def _flips(gate: dict[str, Any], row: RunRow) -> int | None:
    """How many cases would have to change outcome for ``gate`` to change side: its margin times its denominator
    (the count its note gives, else the run's summary's, else the run's cases); None for a gate not on a rate."""
    if gate.get("passed") is None or gate.get("name") == "json_valid_z" \
            or not isinstance(gate.get("value"), (int, float)) or not isinstance(gate.get("threshold"), (int, float)):
        return None
    said = _OVER.search(str(gate.get("note") or ""))
    counts = ((row.toolfid.get("summary") or {}).get("denominators") or {})
    n = int(said.group(1)) if said else counts.get(_GATE_DENOMINATOR.get(gate["name"], ""), 0) or \
        row.toolfid.get("n_cases") or 0
    return max(1, math.ceil(abs(gate["value"] - gate["threshold"]) * n - 1e-9)) if n else None


def _flips_to_change(row: RunRow) -> int | None:
    """How many cases would have to change outcome for the row's verdict to change: a FAIL only if every failed
    gate turns (the hardest of them), a PASS or an undecided verdict if any decided gate does (the easiest)."""
    gates = (row.verdict or {}).get("gates") or []
    if (row.verdict or {}).get("passed") is False:
        failed = [_flips(g, row) for g in gates if g.get("passed") is False]
        return None if not failed or None in failed else max(f for f in failed if f is not None)
    flips = [f for f in (_flips(g, row) for g in gates) if f is not None]
    return min(flips) if flips else None


def near_tie_warning(rows: Sequence[RunRow], base_row: RunRow | None = None, width: int | None = None) -> str:
    """One warning (wrapped to the terminal) when a view has enough cases at a near tie (where another arithmetic
    could pick another token) to change a verdict: the adapters, and the option that checks; empty otherwise (the
    counts are under ``--verbose``)."""
    base_cases, flags = _tie_cases(base_row) if base_row is not None else (0, set())
    at_risk = []
    for row in rows:
        cases, own = _tie_cases(row)
        flips = _flips_to_change(row)
        if cases + base_cases and flips is not None and cases + base_cases >= flips:
            at_risk.append(f"{row.label} ({cases + base_cases} case(s) at a near tie, {flips} would change it)")
            flags |= own
    if not at_risk:
        return ""
    return _fill(f"warning: near ties could change the verdict of {', '.join(at_risk)}: compare with "
                 f"{' / '.join(sorted(flags))} (details: --verbose)", width)


def paint_verdicts(table: str) -> str:
    from lm_eval_toolfid.reporting.term import use_colour

    if not use_colour(sys.stdout):
        return table
    codes = {" PASS ": "32;1", " FAIL ": "31;1", " UNDECIDED ": "33;1"}
    lines = []
    for line in table.splitlines():
        for word, code in codes.items():
            if word in line:
                line = line.replace(word, f" \x1b[{code}m{word.strip()}\x1b[0m ", 1)
                break
        lines.append(line)
    return "\n".join(lines)


def generation_paths(rows: list[Any], base: Any = None) -> str:
    """One line per way the adapter views' tokens were obtained (verified or decoded) and why, and one per group of
    views decoded together (``base``: the base view's row): the run's header."""
    by_reason: dict[str, list[str]] = {}
    groups: list[tuple[str, ...]] = []
    notes: list[str] = []
    graphs: list[str] = []
    for row in [*([base] if base is not None else []), *rows]:
        gen = (row.toolfid or {}).get("generation") or {}
        if gen.get("step_graphs"):
            graphs.append(step_graphs_note(row.label, gen["step_graphs"]))
        if row is not base and gen.get("verify_reason"):
            by_reason.setdefault(gen["verify_reason"] + drafting_note(gen), []).append(row.label)
        together = tuple(gen.get("views_together") or ())
        if len(together) > 1 and together not in groups:
            groups.append(together)
        if gen.get("views_together_note") and gen["views_together_note"] not in notes:
            notes.append(gen["views_together_note"])
    lines = [f"tokens of {', '.join(labels)}: {reason}" for reason, labels in by_reason.items()]
    if groups:
        lines.append("decoded together, one batch per group, each row under its own LoRA: "
                     + "; ".join(" + ".join(g) for g in groups) + (f" ({'; '.join(notes)})" if notes else ""))
    if graphs:
        lines.append("decode steps replayed from CUDA graphs: " + "; ".join(dict.fromkeys(graphs)))
    return "\n".join(_fill(line) for line in lines)


def step_graphs_note(label: str, graphs: dict[str, Any]) -> str:
    """A view's captured decode steps in words (``--cuda-graphs on``)."""
    return (f"{label} {graphs.get('steps_replayed', 0)} of {graphs.get('steps', 0)} steps ({graphs.get('captures', 0)} "
            f"captures, {graphs.get('capture_seconds', 0):.2f} s, {graphs.get('graph_bytes', 0) / 2**20:.0f} MiB)")


def drafting_note(gen: dict[str, Any]) -> str:
    """What a verified view's header line adds when its drafts were rejected early and drafting stopped
    (:mod:`lm_eval_toolfid.engine.scheduler`); empty otherwise."""
    stop = gen.get("drafting_stopped")
    if not stop:
        return ""
    return (f"; drafting stopped after {stop.get('after_rows')} rows: {stop.get('reason')}, so "
            f"{gen.get('rows_draft_dropped', 0)} of {gen.get('rows', 0)} rows were decoded instead")


def verification_note(rows: list[Any]) -> str:
    """One line on how the adapter views' tokens were obtained, one more if any verified token was a near tie,
    one if any view's token on a shared prompt prefix was (every view's, the base's too), and one if any token
    of views decoded together was."""
    parts, ties, prefix_ties, joint_ties, lora_ties, tol = [], [], [], [], [], None
    for row in rows:
        gen = (row.toolfid or {}).get("generation") or {}
        if gen.get("lora_near_tie_tokens"):
            tol = gen.get("near_tie_tolerance", tol)
            lora_ties.append(f"{row.label} {gen['lora_near_tie_tokens']} token(s) in "
                             f"{gen.get('lora_near_tie_cases', 0)} case(s)")
        if gen.get("joint_near_tie_tokens"):
            tol = gen.get("near_tie_tolerance", tol)
            joint_ties.append(f"{row.label} {gen['joint_near_tie_tokens']} token(s) in "
                              f"{gen.get('joint_near_tie_cases', 0)} case(s)")
        if gen.get("prefix_near_tie_tokens"):
            tol = gen.get("near_tie_tolerance", tol)
            prefix_ties.append(f"{row.label} {gen['prefix_near_tie_tokens']} token(s) in "
                               f"{gen.get('prefix_near_tie_cases', 0)} case(s)")
        if not gen.get("rows_verified") or not gen.get("tokens"):
            continue
        stop = gen.get("drafting_stopped")
        parts.append(f"{row.label} {gen['tokens_accepted'] / gen['tokens']:.0%} "
                     f"({gen.get('rows_answered_by_verification', 0)}/{gen['rows']} cases without decoding"
                     + (f"; drafting stopped after {stop.get('after_rows')} rows" if stop else "") + ")")
        tol = gen.get("near_tie_tolerance", tol)
        if gen.get("near_tie_tokens"):
            ties.append(f"{row.label} {gen['near_tie_tokens']} token(s) in {gen['near_tie_cases']} case(s)")
    if not parts and not prefix_ties and not joint_ties and not lora_ties:
        return ""
    paragraphs = ["verified against the base's answers (share of tokens accepted): " + ", ".join(parts)] if parts else []
    if ties:
        paragraphs.append(f"near ties (top-two logit gap < {tol:g}, where verified and decoded arithmetic could "
                          "pick differently): " + "; ".join(ties) + " — compare with --no-verify")
    if prefix_ties:
        paragraphs.append(f"near ties on shared prompt prefixes (top-two logit gap < {tol:g}, where a prefix computed "
                          "once could round otherwise): " + "; ".join(prefix_ties) + " — compare with --no-prefix-cache")
    if joint_ties:
        paragraphs.append(f"near ties in views decoded together (top-two logit gap < {tol:g}, where a view alone, in "
                          "batches of other shapes, could round otherwise): " + "; ".join(joint_ties)
                          + " — compare with --views-together 1")
    if lora_ties:
        paragraphs.append(f"near ties in adapter rows (top-two logit gap < {tol:g}, where the engine's one LoRA "
                          "computation for every adapter could round otherwise than PEFT's own forward): "
                          + "; ".join(lora_ties) + " — compare with lm_eval --model hf ... peft=")
    return "\n".join(_fill(p) for p in paragraphs)
