"""What a null calibration (:class:`~lm_eval_toolfid.run.plan.CalibrationSpec`) asks of files, no model loaded:
whether one calibration serves a run's adapters, its null adapters written, each null's per-case answers kept, the
nulls' results fitted and written.
Running the nulls is the session's (:meth:`lm_eval_toolfid.run.session.ModelSession.fit_nulls`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from lm_eval_toolfid.calibration.fit import Calibration
from lm_eval_toolfid.calibration.nulls import make_null_adapters
from lm_eval_toolfid.calibration.posthoc import calibration_from_results, write_calibration
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.fsutil import atomic_write_text
from lm_eval_toolfid.reporting.view_store import ViewResult, lm_eval_sample_line
from lm_eval_toolfid.run.plan import CalibrationSpec


def check_calibration(spec: CalibrationSpec, adapters: Mapping[str, str]) -> None:
    """One calibration serves every adapter of a run only if they share one shape and one update norm."""
    from lm_eval_toolfid.calibration.adapters import adapter_shape, adapter_update_norm, norms_agree

    shapes = {adapter_shape(p)["hash"] for p in adapters.values()}
    if len(shapes) > 1:
        raise ToolfidError("--null-runs calibrates one adapter shape; these adapters differ in shape: "
                           "calibrate them in separate runs")
    norms = {name: adapter_update_norm(p) for name, p in adapters.items()}
    first_norm = next(iter(norms.values()))
    if not all(norms_agree(first_norm, v) for v in norms.values()):
        raise ToolfidError("--null-runs calibrates one adapter update norm; these adapters differ ("
                           + ", ".join(f"{k} {v:.3g}" for k, v in norms.items()) + "): run each with --null-runs")


def make_nulls(spec: CalibrationSpec, adapter: str, base: str) -> list[Path]:
    """The spec's null adapters, shaped like ``adapter``, written to its null folder."""
    return make_null_adapters(adapter, spec.runs, spec.null_folder, seed=spec.seed, multipliers=spec.multipliers,
                              base=base)


def keep_null_view(spec: CalibrationSpec, view: ViewResult) -> Path:
    """A null's per-case answers (lm-eval sample lines, as every view's ``samples.jsonl``) kept as
    ``spec.samples_folder/NULL.jsonl``: what the random adapter answered, case by case. Not in the adapter's folder
    (its content is its identity) and not as a results file (a run folder's ``results*.json`` are its views)."""
    path = spec.samples_folder / f"{view.label}.jsonl"
    atomic_write_text(path, "".join(lm_eval_sample_line(sample) for sample in view.samples))
    return path


def write_fit(spec: CalibrationSpec, results: list[dict[str, Any]], task: str) -> Calibration:
    """The nulls' lm-eval results fitted and written to ``spec.out``."""
    calibration = calibration_from_results(results, task)
    write_calibration(calibration, spec.out)
    return calibration
