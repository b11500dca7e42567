"""Null calibration: what do adapters of the same shape and size that learned nothing score?

A calibration file holds, per scale multiplier of the null update norm, the per-run metric
values of K random adapters and their fitted mean/std. The adapter is compared with the ×1 runs
in two ways (docs/calibration.md):

- z = (x − mean) / s, where s treats the adapter as one more draw from the null: the larger of
  the runs' sample std and the binomial SE at the pooled Jeffreys rate (null alone, and null plus
  the adapter's own cases), times √(1 + 1/K) for the uncertainty of the null mean. z is always
  finite; a degenerate null (all runs identical) is flagged, since z then rests on the floor alone.
- the empirical rank p-value p = (1 + #{null runs with json_valid_rate ≥ x}) / (K + 1): the chance
  that a random adapter of this size does at least as well; its smallest value is 1/(K + 1).

A metric that is a rate over a subset of cases (hallucination_rate: over a view's valid calls) is undefined for a null
run that has no case in that subset; it is fitted over the runs where it is defined (``MetricFit.n`` of them, the
others named in ``MetricFit.undefined``), and where no run at a multiplier defines it that fit is ``None`` (JSON
``null``): no mean, no spread. json_valid_rate and validity_delta (what z, the rank p and the informative-null test
read) are defined for every paired run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lm_eval_toolfid.calibration.adapters import NORM_RTOL, adapter_shape, adapter_update_norm, norms_agree
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import Summary
from lm_eval_toolfid.core.stats import binomial_se, jeffreys_rate, sample_std
from lm_eval_toolfid.pairing.identity import describe_base
from lm_eval_toolfid.scoring.verdict import NullComparison, VerdictConfig

CALIBRATION_FORMAT = "toolfid-calibration/1"
DEFAULT_ALPHA = 0.05
REFERENCE_MULTIPLIER = 1.0
METRICS = ("json_valid_rate", "parse_rate", "hallucination_rate", "validity_delta")
ALWAYS_DEFINED = ("json_valid_rate", "validity_delta")
"""Rates over every case of a paired run: a null run without them is refused (z, rank p and the informative-null
test read them). The other metrics may be undefined in some runs, or all (see the module docstring)."""


class NullRun(BaseModel):
    """One null adapter's metrics on the case set."""

    model_config = ConfigDict(frozen=True)

    name: str
    seed: int
    multiplier: float
    n_cases: int
    metrics: dict[str, float]


class MetricFit(BaseModel):
    model_config = ConfigDict(frozen=True)

    mean: float
    std: float
    """Sample standard deviation (n−1) of the per-run values."""
    floor: float
    """Binomial SE of the pooled rate (Jeffreys prior): the least spread a new run can show."""
    std_used: float
    floor_used: bool
    n: int
    """The null runs this metric is defined in (and fitted over)."""
    values: list[float]
    undefined: list[str] = []
    """The null runs at this multiplier where the metric is undefined (e.g. hallucination_rate of a run that made no
    valid call): left out of the fit. Empty in files written before fits could leave runs out."""


def defined(metric: str, run: NullRun) -> bool:
    """Whether a null run has a finite value of the metric (a rate over an empty subset has none)."""
    value = run.metrics.get(metric)
    return isinstance(value, (int, float)) and math.isfinite(value)


def _floor(metric: str, runs: list[NullRun]) -> float:
    """Binomial standard error of one run's value at the pooled (Jeffreys) rate (``runs``: those defining it)."""
    if metric == "hallucination_rate":  # a rate over each run's valid cases
        trials = [max(1, round(r.metrics["json_valid_rate"] * r.n_cases)) for r in runs]
        hits = sum(r.metrics[metric] * t for r, t in zip(runs, trials))
    else:  # rates over cases; validity_delta varies exactly as json_valid_rate does (fixed base)
        source = "json_valid_rate" if metric == "validity_delta" else metric
        trials = [r.n_cases for r in runs]
        hits = sum(r.metrics[source] * r.n_cases for r in runs)
    total = sum(trials)
    return binomial_se(jeffreys_rate(hits, total), total / len(runs))


def fit_metric(metric: str, runs: list[NullRun]) -> MetricFit | None:
    """The metric fitted over the runs that define it; None where none does (no value to fit)."""
    have = [r for r in runs if defined(metric, r)]
    if not have:
        return None
    values = [float(r.metrics[metric]) for r in have]
    mu = sum(values) / len(values)
    std = sample_std(values)
    floor = _floor(metric, have)
    return MetricFit(mean=mu, std=std, floor=floor, std_used=max(std, floor), floor_used=floor > std,
                     n=len(values), values=values, undefined=[r.name for r in runs if not defined(metric, r)])


class Calibration(BaseModel):
    """A fitted null distribution plus the provenance that says where it may be used."""

    model_config = ConfigDict(frozen=True)

    format: str = CALIBRATION_FORMAT
    provenance: dict[str, Any]
    runs: list[NullRun]
    fits: dict[str, dict[str, MetricFit | None]] = Field(
        description="multiplier → metric → fit (None: the metric is defined in no null run at that multiplier)")

    @property
    def reference_fit(self) -> dict[str, MetricFit | None]:
        return self.fits[self._fit_key(None)]

    def metric_fit(self, metric: str, multiplier: float | None = None) -> MetricFit:
        """A metric every paired null run defines (:data:`ALWAYS_DEFINED`): its fit, never None in a valid file."""
        found = self.fits[self._fit_key(multiplier)][metric]
        if found is None:  # load_calibration refuses such a file; a Calibration built by hand may still hold one
            raise ToolfidError(f"calibration has no {metric} fit at ×{self._fit_key(multiplier)}; re-run calibrate")
        return found

    def _runs_at(self, key: str) -> list[NullRun]:
        return [r for r in self.runs if _mult_key(r.multiplier) == key]

    def _fit_key(self, multiplier: float | None) -> str:
        if multiplier is not None:
            return _mult_key(multiplier)
        key = _mult_key(REFERENCE_MULTIPLIER)
        return key if key in self.fits else sorted(self.fits, key=float)[0]

    def z_std(self, json_valid_rate: float, multiplier: float | None = None, n: int | None = None) -> float:
        """The spread z divides by: the adapter as one more draw from the null (see module docstring)."""
        key = self._fit_key(multiplier)
        fit = self.metric_fit("json_valid_rate", multiplier)
        runs = self._runs_at(key)
        trials = sum(r.n_cases for r in runs)
        hits = sum(r.metrics["json_valid_rate"] * r.n_cases for r in runs)
        n_new = n or (trials / len(runs) if runs else 1)
        one_run = max(fit.std, fit.floor, binomial_se(jeffreys_rate(hits, trials), n_new),
                      binomial_se(jeffreys_rate(hits + json_valid_rate * n_new, trials + n_new), n_new))
        return one_run * math.sqrt(1.0 + 1.0 / fit.n)

    def z(self, json_valid_rate: float, multiplier: float | None = None, n: int | None = None) -> float:
        fit = self.metric_fit("json_valid_rate", multiplier)
        return (json_valid_rate - fit.mean) / self.z_std(json_valid_rate, multiplier, n)

    def z_profile(self, json_valid_rate: float, n: int | None = None) -> dict[str, float]:
        return {m: self.z(json_valid_rate, float(m), n) for m in sorted(self.fits, key=float)}

    def rank_p(self, json_valid_rate: float, multiplier: float | None = None) -> tuple[float, int]:
        """(p, K): p = (1 + #{null runs with json_valid_rate ≥ x}) / (K + 1) — ties count against the adapter."""
        values = self.metric_fit("json_valid_rate", multiplier).values
        at_least = sum(1 for v in values if v >= json_valid_rate - 1e-12)
        return (1 + at_least) / (len(values) + 1), len(values)

    def degenerate(self, multiplier: float | None = None) -> bool:
        """Fewer than two null runs, or all of them scored the same: the null shows no spread of its own."""
        values = self.metric_fit("json_valid_rate", multiplier).values
        return len(values) < 2 or max(values) == min(values)

    def compare(self, summary: Summary, config: VerdictConfig = VerdictConfig(),
                alpha: float = DEFAULT_ALPHA) -> NullComparison:
        if not 0.0 < alpha < 1.0:
            raise ToolfidError(f"alpha must be between 0 and 1 (got {alpha})")
        key = self._fit_key(None)
        valid = self.metric_fit("json_valid_rate")
        null_delta = self.metric_fit("validity_delta").mean
        x, n = summary.json_valid_rate, summary.n_relevant or None
        p, k = self.rank_p(x)
        degenerate = self.degenerate()
        notes = []
        if 1.0 / (k + 1) > alpha:
            notes.append(f"K={k} null runs cannot show p ≤ {alpha:g}; use ≥ {min_runs(alpha)}")
        if degenerate:
            values = valid.values
            notes.append(f"null degenerate: {'the only' if k < 2 else f'all {k}'} ×{key} null run"
                         f"{'' if k < 2 else 's'} scored {values[0]:.3f}; z rests on the binomial floor")
        return NullComparison(
            z=self.z(x, n=n),
            null_mean=valid.mean,
            null_std=self.z_std(x, n=n),
            informative=null_delta < config.validity_delta_floor,
            null_validity_delta=null_delta,
            rank_p=p,
            k=k,
            rank_note="; ".join(notes) or None,
            degenerate=degenerate,
        )

    def check_compatible(self, run_key: Any, adapter_path: str | None) -> None:
        """Refuse (one line) a calibration made for another base, case set, prompt or adapter shape."""
        prov = self.provenance
        key = run_key.as_dict()
        for field, label in (("case_set", "case set"), ("prompt", "prompt settings"), ("generation", "generation settings")):
            if prov.get(field) != key[field]:
                raise ToolfidError(f"calibration was made for another {label} ({prov.get(field)} ≠ {key[field]})")
        if prov.get("base") != key["base"]:
            theirs = prov.get("base") if isinstance(prov.get("base"), dict) else {}
            differ = [f"{k} {theirs.get(k, '—')} ≠ {key['base'].get(k, '—')}"
                      for k in sorted(set(theirs) | set(key["base"])) if theirs.get(k) != key["base"].get(k)]
            raise ToolfidError(f"calibration was made for another base model than this run's ({describe_base(theirs)} "
                               f"vs {describe_base(key['base'])}: {'; '.join(differ)}); re-run toolfid calibrate "
                               "for this base")
        if adapter_path is None:
            raise ToolfidError("calibration z-scores an adapter run; this run has no peft= adapter")
        shape = adapter_shape(adapter_path)
        if prov.get("adapter_shape") != shape["hash"]:
            raise ToolfidError(f"calibration was made for an adapter of another shape "
                               f"({prov.get('adapter_shape')} ≠ {shape['hash']}: {shape['summary']})")
        ref = prov.get("adapter_update_norm")
        redo = f"re-run `toolfid calibrate --adapter {adapter_path}` (or make-null-adapters --like {adapter_path})"
        if isinstance(ref, bool) or not isinstance(ref, (int, float)) or not math.isfinite(ref):
            raise ToolfidError(f"calibration records no adapter update norm (made by an older toolfid?): {redo}")
        norm = adapter_update_norm(adapter_path)
        if not norms_agree(norm, float(ref)):
            raise ToolfidError(
                f"calibration was made for an adapter of update norm {ref:.4g}, this adapter's is {norm:.4g} "
                f"({(norm - ref) / ref if ref else float('inf'):+.0%}; tolerance ±{NORM_RTOL:.0%}): {redo}")

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def min_runs(alpha: float) -> int:
    """The least K whose smallest rank p-value 1/(K + 1) is ≤ alpha."""
    return max(1, math.ceil(1.0 / alpha - 1.0 - 1e-9))


def _mult_key(multiplier: float | None) -> str:
    return f"{float(multiplier if multiplier is not None else REFERENCE_MULTIPLIER):g}"


def fit(runs: list[NullRun], provenance: dict[str, Any]) -> Calibration:
    """Fit every metric at every multiplier, each over the runs that define it (a null run that made no valid call
    has no hallucination_rate: that fit leaves it out, the others keep it)."""
    if not runs:
        raise ToolfidError("no null runs to fit")
    missing = sorted(((m != "validity_delta", r.name, m) for r in runs for m in ALWAYS_DEFINED if not defined(m, r)))
    if missing:  # unpaired first: it is the cause of every other missing metric
        _, name, metric = missing[0]
        if metric == "validity_delta":
            raise ToolfidError(f"null run {name} lacks paired metrics (validity_delta): "
                               "run the base model first so adapter runs pair with it")
        raise ToolfidError(f"null run {name} has no {metric} (its results carry no per-case validity): "
                           "re-run it with this toolfid")
    runs = sorted(runs, key=lambda r: (r.multiplier, r.seed, r.name))  # values in one order, however the runs came
    by_mult: dict[str, list[NullRun]] = {}
    for run in runs:
        by_mult.setdefault(_mult_key(run.multiplier), []).append(run)
    fits = {m: {metric: fit_metric(metric, rs) for metric in METRICS} for m, rs in sorted(by_mult.items())}
    return Calibration(provenance=provenance, runs=runs, fits=fits)


def load_calibration(path: str | Path) -> Calibration:
    """A calibration file, checked whole: any defect is one line naming the file and what to do."""
    p = Path(path).expanduser()
    try:
        payload = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ToolfidError(f"cannot read calibration {p}: {exc}") from None
    if not isinstance(payload, dict) or payload.get("format") != CALIBRATION_FORMAT:
        raise ToolfidError(f"{p} is not a toolfid calibration file ({CALIBRATION_FORMAT})")
    try:
        cal = Calibration.model_validate(payload)
    except Exception as exc:  # pydantic detail is long; one line is enough
        lines = str(exc).splitlines()
        raise ToolfidError(f"{p}: malformed calibration file ({' '.join(lines[:2])}); re-run calibrate") from None
    problem = _defect(cal)
    if problem:
        raise ToolfidError(f"{p}: malformed calibration file ({problem}); re-run calibrate")
    return cal


def _defect(cal: Calibration) -> str | None:
    """What makes a parsed calibration unusable, or None."""
    if not cal.fits:
        return "no fits"
    if not cal.runs:
        return "no null runs (K=0)"
    for key, fits in cal.fits.items():
        try:
            mult = float(key)
        except ValueError:
            return f"multiplier {key!r} is not a number"
        if not math.isfinite(mult) or mult <= 0:
            return f"multiplier {key!r} is not positive"
        missing = [m for m in METRICS if m not in fits]
        if missing:
            return f"×{key} lacks the {missing[0]} fit"
        runs = [r for r in cal.runs if _mult_key(r.multiplier) == key]
        for metric, f in fits.items():
            where = f"×{key} {metric}"
            have = sum(1 for r in runs if defined(metric, r))
            if f is None:
                if metric in ALWAYS_DEFINED:
                    return f"{where}: no fit (null); every paired null run defines it"
                if have:
                    return f"{where}: no fit (null) although {have} null run(s) define it"
                continue
            if f.n < 1 or len(f.values) != f.n:
                return f"{where}: K={f.n} with {len(f.values)} values"
            numbers = [f.mean, f.std, f.floor, f.std_used, *f.values]
            if not all(math.isfinite(v) for v in numbers):
                return f"{where}: NaN or infinite mean/std/values"
            if f.std_used <= 0:
                return f"{where}: non-positive std"
        if len(runs) != fits["json_valid_rate"].n:  # not None: refused above
            return f"×{key}: {len(runs)} null runs listed for K={fits['json_valid_rate'].n}"
        for metric, f in fits.items():  # a partial fit: its runs are those defining it, the rest named
            have = sum(1 for r in runs if defined(metric, r))
            if f is not None and (f.n != have or f.n + len(f.undefined) != len(runs)):
                return (f"×{key} {metric}: fitted over {f.n} null runs, {len(f.undefined)} named undefined; "
                        f"{have} of the {len(runs)} listed define it")
    for r in cal.runs:
        if r.n_cases < 1:
            return f"null run {r.name} has n_cases={r.n_cases}"
        if "json_valid_rate" not in r.metrics or not math.isfinite(r.metrics["json_valid_rate"]):
            return f"null run {r.name} has no finite json_valid_rate"
    return None
