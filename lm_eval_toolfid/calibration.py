"""Null calibration: what do adapters of the same shape that learned nothing score?

A calibration file holds, per scale multiplier of the null update norm, the per-run metric
values of K random adapters and their fitted mean/std. z-scores use the ×1 fit. When the null
runs agree exactly (e.g. all at 0 valid) the sample std is 0; it is floored by the binomial
standard error of the pooled rate under a Jeffreys prior, so z is always finite — the file
records whether the floor was used.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .errors import ToolfidError
from .records import Summary
from .stats import binomial_se, jeffreys_rate, sample_std
from .verdict import NullComparison, VerdictConfig

CALIBRATION_FORMAT = "toolfid-calibration/1"
REFERENCE_MULTIPLIER = 1.0
METRICS = ("json_valid_rate", "parse_rate", "hallucination_rate", "validity_delta")


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
    values: list[float]


def _floor(metric: str, runs: list[NullRun]) -> float:
    """Binomial standard error of one run's value at the pooled (Jeffreys) rate."""
    if metric == "hallucination_rate":
        trials = [max(1, round(r.metrics["json_valid_rate"] * r.n_cases)) for r in runs]
        hits = sum(r.metrics[metric] * t for r, t in zip(runs, trials))
    else:  # rates over cases; validity_delta varies exactly as json_valid_rate does (fixed base)
        source = "json_valid_rate" if metric == "validity_delta" else metric
        trials = [r.n_cases for r in runs]
        hits = sum(r.metrics[source] * r.n_cases for r in runs)
    total = sum(trials)
    return binomial_se(jeffreys_rate(hits, total), total / len(runs))


def fit_metric(metric: str, runs: list[NullRun]) -> MetricFit:
    values = [float(r.metrics[metric]) for r in runs]
    mu = sum(values) / len(values)
    std = sample_std(values)
    floor = _floor(metric, runs)
    return MetricFit(mean=mu, std=std, floor=floor, std_used=max(std, floor), floor_used=floor > std,
                     n=len(values), values=values)


class Calibration(BaseModel):
    """A fitted null distribution plus the provenance that says where it may be used."""

    model_config = ConfigDict(frozen=True)

    format: str = CALIBRATION_FORMAT
    provenance: dict[str, Any]
    runs: list[NullRun]
    fits: dict[str, dict[str, MetricFit]] = Field(description="multiplier → metric → fit")

    @property
    def reference_fit(self) -> dict[str, MetricFit]:
        key = _mult_key(REFERENCE_MULTIPLIER)
        return self.fits.get(key) or self.fits[sorted(self.fits)[0]]

    def z(self, json_valid_rate: float, multiplier: float | None = None) -> float:
        fit = (self.fits[_mult_key(multiplier)] if multiplier is not None else self.reference_fit)["json_valid_rate"]
        return (json_valid_rate - fit.mean) / fit.std_used

    def z_profile(self, json_valid_rate: float) -> dict[str, float]:
        return {m: (json_valid_rate - f["json_valid_rate"].mean) / f["json_valid_rate"].std_used
                for m, f in sorted(self.fits.items(), key=lambda kv: float(kv[0]))}

    def compare(self, summary: Summary, config: VerdictConfig = VerdictConfig()) -> NullComparison:
        fit = self.reference_fit
        null_delta = fit["validity_delta"].mean
        return NullComparison(
            z=self.z(summary.json_valid_rate),
            null_mean=fit["json_valid_rate"].mean,
            null_std=fit["json_valid_rate"].std_used,
            informative=null_delta < config.validity_delta_floor,
            null_validity_delta=null_delta,
        )

    def check_compatible(self, run_key: Any, adapter_path: str | None) -> None:
        """Refuse (one line) a calibration made for another base, case set, prompt or adapter shape."""
        prov = self.provenance
        key = run_key.as_dict()
        for field, label in (("case_set", "case set"), ("prompt", "prompt settings"), ("generation", "generation settings")):
            if prov.get(field) != key[field]:
                raise ToolfidError(f"calibration was made for another {label} ({prov.get(field)} ≠ {key[field]})")
        if prov.get("base") != key["base"]:
            raise ToolfidError(
                f"calibration was made for another base model ({prov.get('base', {}).get('pretrained')}, "
                f"fingerprint {prov.get('base', {}).get('fingerprint')}) than this run's ({key['base'].get('pretrained')})"
            )
        if adapter_path is None:
            raise ToolfidError("calibration z-scores an adapter run; this run has no peft= adapter")
        shape = adapter_shape(adapter_path)
        if prov.get("adapter_shape") != shape["hash"]:
            raise ToolfidError(f"calibration was made for an adapter of another shape "
                               f"({prov.get('adapter_shape')} ≠ {shape['hash']}: {shape['summary']})")

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def _mult_key(multiplier: float | None) -> str:
    return f"{float(multiplier if multiplier is not None else REFERENCE_MULTIPLIER):g}"


def fit(runs: list[NullRun], provenance: dict[str, Any]) -> Calibration:
    """Fit every metric at every multiplier."""
    if not runs:
        raise ToolfidError("no null runs to fit")
    missing = [r.name for r in runs if any(m not in r.metrics for m in METRICS)]
    if missing:
        raise ToolfidError(f"null run {missing[0]} lacks paired metrics (validity_delta): "
                           "run the base model first so adapter runs pair with it")
    by_mult: dict[str, list[NullRun]] = {}
    for run in runs:
        by_mult.setdefault(_mult_key(run.multiplier), []).append(run)
    fits = {m: {metric: fit_metric(metric, rs) for metric in METRICS} for m, rs in sorted(by_mult.items())}
    return Calibration(provenance=provenance, runs=sorted(runs, key=lambda r: (r.multiplier, r.seed)), fits=fits)


def load_calibration(path: str | Path) -> Calibration:
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
        raise ToolfidError(f"{p}: malformed calibration file ({str(exc).splitlines()[0]})") from None
    if any(not math.isfinite(f.std_used) or f.std_used <= 0 for fs in cal.fits.values() for f in fs.values()):
        raise ToolfidError(f"{p}: calibration has a non-positive std")
    return cal


# --- adapter shape -------------------------------------------------------------------------

_SHAPE_CONFIG_KEYS = ("peft_type", "r", "lora_alpha", "target_modules", "use_rslora", "use_dora",
                      "rank_pattern", "alpha_pattern", "modules_to_save", "fan_in_fan_out", "bias")


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    with path.open("rb") as fh:
        header_len = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(header_len))
    return {k: v["shape"] for k, v in sorted(header.items()) if k != "__metadata__"}


def adapter_shape(adapter_dir: str | Path) -> dict[str, Any]:
    """Hash of what makes two adapters 'the same shape': LoRA config and tensor shapes."""
    root = Path(adapter_dir).expanduser()
    cfg_path = root / "adapter_config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ToolfidError(f"not a PEFT adapter directory: {root} ({exc.__class__.__name__}: adapter_config.json)") from None
    picked = {k: cfg.get(k) for k in _SHAPE_CONFIG_KEYS}
    if isinstance(picked.get("target_modules"), list):
        picked["target_modules"] = sorted(picked["target_modules"])
    weights = root / "adapter_model.safetensors"
    shapes = _safetensors_shapes(weights) if weights.is_file() else {}
    blob = json.dumps({"config": picked, "shapes": shapes}, sort_keys=True).encode()
    summary = f"r={picked.get('r')}, alpha={picked.get('lora_alpha')}, targets={picked.get('target_modules')}"
    return {"hash": hashlib.sha256(blob).hexdigest()[:16], "summary": summary, "config": picked}
