"""The compound verdict: every gate must hold, and the data must be able to show a failure.

Gates (each can be PASS, FAIL, or undecided):

- **validity**: ``validity_delta`` (adapter − base) ≥ floor (default −0.05). Mode ``point`` (default,
  the original rule) judges the point estimate; mode ``noninferiority`` passes only when the 95%
  paired CI's lower bound is ≥ floor (fails when the point estimate is below it, else undecided).
  Either way the text says whether a failure is statistically clear (the whole CI below the floor)
  or not (the point estimate fails and the CI reaches back over the floor: the gate fails all the same).
- **hallucination**: ``hallucination_delta`` (adapter − base, each over its own valid calls) ≤ cap
  (default 0.10) — the gate judges the adapter's *change*; ``hallucination_gate: absolute`` applies
  the original rule ``hallucination_rate ≤ cap`` instead. When its value is undefined (a view with no
  valid call: the adapter's, or in delta mode the base's) the gate is *not measured*: it cannot decide
  (``passed`` None, ``measured`` False), so the verdict can never PASS through it, and the reason says
  why ("hallucination not measured: the adapter makes no valid call"). Such an adapter is normally
  FAILed by the validity gate; a base without a valid call is UNDECIDED by ``min_base_validity``.
- **false calls** (only with irrelevance cases): ``false_call_delta`` ≤ ``false_call_cap``; not measured,
  in the same way, when one view has no irrelevance case in its denominator while the other has.
- **z** (only with a null calibration that is informative, i.e. random adapters of this size push
  validity below the base by more than the floor): ``json_valid_z`` ≥ ``z_min``.

- **multi-turn** (only when the case set has cases with a history): the validity gate again, on the
  multi-turn cases (turn depth ≥ 2) alone — ``multiturn_validity_delta``. It is a second test on a
  subset, so it fails only when the failure is *statistically clear* (the whole 95% paired interval
  below the floor: for an adapter that changes nothing, a false alarm has probability ≤ 2.5%), and it
  is applied only to at least :data:`MIN_GATE_N` multi-turn cases expecting a call whose base is not
  too weak (``min_base_validity`` on the subset); otherwise it is reported in the notes, not gated.
  When it fails while the validity gate over all cases holds — or fails with single-turn cases that
  hold — the reason says so: "multi-turn cases alone: validity_delta −0.30 < −0.05 (statistically
  clear, …)".

A verdict must be earned: with no paired base, or when the base itself makes valid calls on fewer
than ``min_base_validity`` of the cases (default 0.2 — below that, most cases cannot show a
regression, because an adapter can only lose validity where the base had it), the verdict is
UNDECIDED with the reason. An adapter whose every output equals the base's can never FAIL (the
floor is ≤ 0 and the caps ≥ 0; non-inferiority that cannot be shown is UNDECIDED, not FAIL).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lm_eval_toolfid.core.records import Summary
from lm_eval_toolfid.scoring.metrics import MULTI_TURN, SINGLE_TURN

MIN_GATE_N = 20
"""A gate on a rate with fewer items than this says its denominator is tiny."""


class VerdictConfig(BaseModel):
    """Thresholds of the compound rule (settable from the task YAML or ``--metadata``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    validity_delta_floor: float = Field(default=-0.05, ge=-1.0, le=0.0)
    hallucination_cap: float = Field(default=0.10, ge=0.0, le=1.0)
    false_call_cap: float = Field(default=0.10, ge=0.0, le=1.0)
    z_min: float = 3.0
    min_base_validity: float = Field(default=0.2, ge=0.0, le=1.0)
    gate_mode: Literal["point", "noninferiority"] = "point"
    hallucination_gate: Literal["delta", "absolute"] = "delta"

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> VerdictConfig:
        keys = cls.model_fields.keys()
        return cls(**{k: metadata[k] for k in keys if metadata.get(k) is not None})


class NullComparison(BaseModel):
    """How the adapter's validity compares with the null (random-adapter) distribution."""

    model_config = ConfigDict(frozen=True)

    z: float
    null_mean: float
    null_std: float
    informative: bool
    null_validity_delta: float
    rank_p: float | None = None
    """Empirical rank p-value over the ×1 null runs: (1 + #{nulls with json_valid_rate ≥ the adapter's}) / (K + 1)."""
    k: int = 0
    """Number of ×1 null runs (the smallest possible rank_p is 1/(K + 1))."""
    rank_note: str | None = None
    """Why rank_p (or z) is weak: K too small for alpha, or a degenerate null."""
    degenerate: bool = False
    """All ×1 null runs scored the same (or K < 2): z rests on the binomial floor alone."""


class Gate(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    value: float | None
    threshold: float
    op: Literal[">=", "<="]
    passed: bool | None
    """None: this gate cannot decide (makes the verdict UNDECIDED unless another gate fails)."""
    note: str = ""
    ci: tuple[float, float] | None = None
    clear: bool | None = None
    """For a failed gate: the whole 95% interval is on the failing side (statistically clear)."""
    shown: str | None = None
    """How the reason names the gate, when not by ``name`` (e.g. "multi-turn cases alone: validity_delta")."""
    measured: bool = True
    """False: the gate's metric is undefined (e.g. ``hallucination_delta`` when the adapter makes no valid
    call); such a gate cannot decide (``passed`` is None) and ``note`` says why."""

    def describe(self) -> str:
        value = "—" if self.value is None else f"{self.value:+.3f}"
        bad_op = "<" if self.op == ">=" else ">"
        ci = f", 95% CI [{self.ci[0]:+.3f}, {self.ci[1]:+.3f}]" if self.ci else ""
        name = self.shown or self.name
        if not self.measured:
            return f"{name} not measured" + (f": {self.note}" if self.note else "")
        if self.passed is False:
            how = "statistically clear" if self.clear else ("not statistically clear" if self.clear is False else "")
            return f"{name} {value} {bad_op} {self.threshold:+.3f}" + (f" ({how}{ci})" if how or ci else "")
        if self.passed is None:
            return f"{name} {value}: {self.note}" if self.note else f"{name} undecided"
        return f"{name} {value} {self.op} {self.threshold:+.3f}{ci}"


class Verdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    passed: bool | None
    """None when it cannot be decided (no paired base, a base too weak to show a failure, …)."""
    gates: list[Gate]
    notes: list[str] = Field(default_factory=list)
    reason: str = ""
    """One line: why PASS, FAIL or UNDECIDED."""

    @property
    def label(self) -> str:
        return label_of(self.passed)

    def failed_gates(self) -> list[str]:
        return [g.name for g in self.gates if g.passed is False]

    def as_record(self) -> dict[str, Any]:
        return {**self.model_dump(mode="json"), "label": self.label}


def label_of(passed: bool | None) -> str:
    """The one PASS/FAIL/UNDECIDED mapping."""
    return {True: "PASS", False: "FAIL", None: "UNDECIDED"}[passed]


def _fraction(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def _validity_gate(summary: Summary, config: VerdictConfig) -> Gate:
    delta, ci, floor = summary.validity_delta, summary.validity_delta_ci, config.validity_delta_floor
    if delta is None:
        return Gate(name="validity_delta", value=None, threshold=floor, op=">=", passed=None,
                    note="no case expects a call")
    clear = ci is not None and ci[1] < floor
    if config.gate_mode == "noninferiority":
        if ci is not None and ci[0] >= floor:
            return Gate(name="validity_delta", value=delta, threshold=floor, op=">=", passed=True, ci=ci,
                        note="non-inferiority shown: the CI's lower bound is at or above the floor")
        if delta < floor:
            return Gate(name="validity_delta", value=delta, threshold=floor, op=">=", passed=False, ci=ci,
                        clear=clear)
        return Gate(name="validity_delta", value=delta, threshold=floor, op=">=", passed=None, ci=ci,
                    note=f"non-inferiority not shown: the 95% CI's lower bound {ci[0]:+.3f} is below the floor "
                         f"{floor:+.3f} (more cases would narrow it)" if ci else "no interval")
    passed = delta >= floor
    note = ""
    if passed and ci is not None and ci[0] < floor:
        note = "passes on the point estimate; the 95% CI reaches below the floor"
    return Gate(name="validity_delta", value=delta, threshold=floor, op=">=", passed=passed, ci=ci,
                clear=clear if not passed else None, note=note)


MULTI_TURN_SHOWN = "multi-turn cases alone: validity_delta"


def _multiturn_gate(summary: Summary, config: VerdictConfig) -> tuple[Gate | None, str | None]:
    """The validity gate on the multi-turn cases alone, or (when it cannot be applied) a note saying why;
    (None, None) for a case set without multi-turn cases."""
    sub = (summary.by_depth or {}).get(MULTI_TURN)
    if sub is None or not sub.paired:
        return None, None
    delta, ci, floor, n = sub.validity_delta, sub.validity_delta_ci, config.validity_delta_floor, sub.n_relevant
    if delta is None:
        return None, None
    where = f"multi-turn cases alone ({n} expecting a call): validity_delta {delta:+.3f}"
    base_valid = sub.base_json_valid_rate
    if n < MIN_GATE_N:
        return None, f"{where}; too few to gate (< {MIN_GATE_N}), reported only"
    if base_valid is not None and base_valid < config.min_base_validity:
        return None, (f"{where}; the base makes valid calls on only {_fraction(base_valid)} of them "
                      f"(min_base_validity {_fraction(config.min_base_validity)}): reported, not gated")
    clear = ci is not None and ci[1] < floor
    note = f"over {n} multi-turn cases"
    if delta < floor and not clear:
        note += "; below the floor within noise: a subset gate fails only when the failure is statistically clear"
    return Gate(name="multiturn_validity_delta", value=delta, threshold=floor, op=">=", passed=not (delta < floor and clear),
                ci=ci, clear=True if clear and delta < floor else None, note=note, shown=MULTI_TURN_SHOWN), None


def _single_turn_holds(summary: Summary, config: VerdictConfig) -> str | None:
    """"while single-turn cases hold (validity_delta −0.02)" when the single-turn cases alone pass."""
    sub = (summary.by_depth or {}).get(SINGLE_TURN)
    if sub is None or sub.validity_delta is None or sub.validity_delta < config.validity_delta_floor:
        return None
    return f"while single-turn cases hold (validity_delta {sub.validity_delta:+.3f})"


def _missing_views(summary: Summary, rate: str, both: bool, what: str) -> str:
    """Why ``rate`` (or, with ``both``, the delta of the two views' ``rate``) is undefined: "the adapter makes
    no valid call", "the base …" or "neither view makes a valid call" (``what``: "makes {} valid call")."""
    ft = summary.get(rate) is None
    base = both and summary.get(f"base_{rate}") is None
    if ft and base:
        return "neither view " + what.format("a")
    return ("the base " if base else "the adapter ") + what.format("no")


def _not_measured(name: str, shown: str, threshold: float, why: str) -> Gate:
    """A gate whose metric is undefined: it cannot decide (never a PASS through it), and says why."""
    return Gate(name=name, value=None, threshold=threshold, op="<=", passed=None, measured=False, shown=shown,
                note=why)


def _hallucination_gate(summary: Summary, config: VerdictConfig) -> Gate:
    n = summary.denominators.get("hallucination_rate", 0)
    small = f"over only {n} valid cases" if n < MIN_GATE_N else f"over {n} valid cases"
    absolute = config.hallucination_gate == "absolute"
    if absolute:
        value = summary.get("hallucination_rate")
        name, ci = "hallucination_rate", None
    else:
        value = summary.get("hallucination_delta")
        name, ci = "hallucination_delta", summary.hallucination_delta_ci
    if value is None:  # no valid call in a view it needs: the rate (or the delta) is undefined, not 0
        return _not_measured(name, "hallucination", config.hallucination_cap,
                             _missing_views(summary, "hallucination_rate", not absolute, "makes {} valid call"))
    passed = value <= config.hallucination_cap
    clear = (ci[0] > config.hallucination_cap) if (ci is not None and not passed) else None
    return Gate(name=name, value=value, threshold=config.hallucination_cap, op="<=", passed=passed, ci=ci,
                clear=clear, note=small)


def judge(summary: Summary, config: VerdictConfig = VerdictConfig(), null: NullComparison | None = None) -> Verdict:
    """Apply the compound rule to a run's summary."""
    notes: list[str] = []
    if summary.get("identical_output_rate") == 1.0:
        notes.append("the adapter changed no output (identical_output_rate 1.0): was it applied? "
                     "(e.g. vLLM data-parallel runs have silently dropped LoRA adapters, lm-eval issue 2432)")
    if not summary.paired:
        return Verdict(passed=None, gates=[], notes=notes,
                       reason="no paired base run: run the same command without the adapter first "
                              "(or pass base_samples)")
    gates = [_validity_gate(summary, config)]
    gates.append(_hallucination_gate(summary, config))
    if summary.n_irrelevant and summary.get("false_call_rate") is None and summary.get("base_false_call_rate") is None:
        notes.append(f"false calls not measured on the {summary.n_irrelevant} cases that expect no call: the prompt "
                     "starts every answer with a call (plain-v3); the chat style or plain-v2 measures them")
    elif summary.n_irrelevant and summary.get("false_call_delta") is not None:
        value = summary.get("false_call_delta")
        gates.append(Gate(name="false_call_delta", value=value, threshold=config.false_call_cap, op="<=",
                          passed=value <= config.false_call_cap, note=f"over {summary.n_irrelevant} irrelevance cases"))
    elif summary.n_irrelevant:  # one view has irrelevance cases in its denominator, the other none
        gates.append(_not_measured("false_call_delta", "false calls", config.false_call_cap, _missing_views(
            summary, "false_call_rate", True, "has {} case that expects no call in its denominator")))
    multiturn, multiturn_note = _multiturn_gate(summary, config)
    if multiturn is not None:
        gates.append(multiturn)
    if multiturn_note:
        notes.append(multiturn_note)
    if null is None:
        notes.append("no null calibration: z not computed")
    elif null.informative:
        gates.append(Gate(name="json_valid_z", value=null.z, threshold=config.z_min, op=">=",
                          passed=null.z >= config.z_min, note="vs random adapters of the same size"))
    else:
        notes.append(
            f"null not informative (random adapters keep validity: mean delta {null.null_validity_delta:+.3f} "
            f"≥ floor {config.validity_delta_floor:+.3f}); z={null.z:+.2f} reported, not gated"
        )
    for extra in ("rank_note",):
        text = getattr(null, extra, None) if null is not None else None
        if text:
            notes.append(text)

    base_valid = summary.base_json_valid_rate
    if summary.n_relevant and base_valid is not None and base_valid < config.min_base_validity:
        reason = (f"the base makes valid calls on only {_fraction(base_valid)} of cases with this prompt "
                  f"(min_base_validity {_fraction(config.min_base_validity)}); fidelity cannot be judged — "
                  "try `demos`, the chat prompt style, or another case set")
        return Verdict(passed=None, gates=gates, notes=notes, reason=reason)

    decided = [g.passed for g in gates]
    passed = False if False in decided else (None if None in decided else True)
    if passed is False:
        parts = []
        for g in gates:
            if g.passed is not False:
                continue
            if g is multiturn:  # said when the whole set's validity holds, or single-turn cases do
                holds = _single_turn_holds(summary, config)
                if gates[0].passed is False and holds is None:
                    continue
                parts.append(g.describe() + (f", {holds}" if holds else ""))
            else:
                parts.append(g.describe())
        # a gate that could not be measured is said too: a FAIL's reason must not read as if it held
        parts += [g.describe() for g in gates if not g.measured]
        reason = "; ".join(parts)
    elif passed is None:
        reason = "; ".join(g.describe() for g in gates if g.passed is None)
    else:
        reason = "all gates hold" + "".join(f"; {g.name}: {g.note}" for g in gates
                                            if g.note.startswith("passes on the point"))
        if multiturn is not None and multiturn.value is not None and multiturn.value < multiturn.threshold:
            ci = multiturn.ci
            reason += (f"; {MULTI_TURN_SHOWN} {multiturn.value:+.3f} is below the floor within noise"
                       + (f" (95% CI [{ci[0]:+.3f}, {ci[1]:+.3f}])" if ci else ""))
    return Verdict(passed=passed, gates=gates, notes=notes, reason=reason)
