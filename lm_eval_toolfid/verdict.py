"""The compound verdict: every gate must hold.

- validity delta (ft − base) ≥ floor (default −0.05)
- hallucination rate ≤ cap (default 0.10)
- when a null calibration exists *and is informative* (random adapters of this size push
  validity below the base by more than the floor): z(json_valid_rate_ft) ≥ z_min (default 3).
  An uninformative null cannot separate anything, so the z gate is skipped and the verdict says so.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .records import Summary


class VerdictConfig(BaseModel):
    """Thresholds of the compound rule (settable from the task YAML or ``--metadata``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    validity_delta_floor: float = Field(default=-0.05, ge=-1.0, le=1.0)
    hallucination_cap: float = Field(default=0.10, ge=0.0, le=1.0)
    z_min: float = 3.0

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
    note: str = ""


class Verdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    passed: bool | None
    """None when it cannot be decided (no base reference to pair with)."""
    gates: list[Gate]
    notes: list[str] = Field(default_factory=list)

    @property
    def label(self) -> str:
        return {True: "PASS", False: "FAIL", None: "UNDECIDED"}[self.passed]

    def failed_gates(self) -> list[str]:
        return [g.name for g in self.gates if g.passed is False]


def _gate(name: str, value: float | None, threshold: float, op: Literal[">=", "<="], note: str = "") -> Gate:
    if value is None:
        return Gate(name=name, value=None, threshold=threshold, op=op, passed=None, note=note)
    ok = value >= threshold if op == ">=" else value <= threshold
    return Gate(name=name, value=value, threshold=threshold, op=op, passed=ok, note=note)


def judge(summary: Summary, config: VerdictConfig = VerdictConfig(), null: NullComparison | None = None) -> Verdict:
    """Apply the compound rule to a run's summary."""
    notes: list[str] = []
    gates = [
        _gate("validity_delta", summary.validity_delta, config.validity_delta_floor, ">=",
              "" if summary.paired else "no base reference: delta unknown"),
        _gate("hallucination_rate", summary.hallucination_rate, config.hallucination_cap, "<=",
              f"over {summary.n_valid} valid calls"),
    ]
    if null is None:
        notes.append("no null calibration: z not computed")
    elif null.informative:
        gates.append(_gate("json_valid_z", null.z, config.z_min, ">=", "vs random adapters of the same size"))
    else:
        notes.append(
            f"null not informative (random adapters keep validity: mean delta {null.null_validity_delta:+.3f} "
            f"≥ floor {config.validity_delta_floor:+.3f}); z={null.z:+.2f} reported, not gated"
        )
    decided = [g.passed for g in gates]
    passed = False if False in decided else (None if None in decided else True)
    return Verdict(passed=passed, gates=gates, notes=notes)
