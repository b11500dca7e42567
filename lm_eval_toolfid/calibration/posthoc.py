"""Calibration from existing ``lm_eval`` results: fit from runs of null adapters
(``toolfid calibrate --from-results``), and z plus the verdict for an existing results file
(``toolfid score``)."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from lm_eval_toolfid.calibration.fit import DEFAULT_ALPHA, NORM_RTOL, Calibration, NullRun, fit, load_calibration
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.fsutil import atomic_write_text
from lm_eval_toolfid.core.records import Summary
from lm_eval_toolfid.reporting.results import RunRow, load_results, n_cases, row_from_results
from lm_eval_toolfid.scoring.verdict import VerdictConfig, judge

log = logging.getLogger("lm_eval.toolfid")
from lm_eval_toolfid.calibration.nulls import NULL_MARKER, read_marker

# --- fitting from lm-eval results ---------------------------------------------------------

def _versions() -> dict[str, str]:
    out = {}
    for dist in ("lm-eval-toolfid", "lm_eval", "torch", "transformers", "peft"):
        try:
            out[dist] = importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def null_run_from_results(results: dict[str, Any], task: str | None = None) -> tuple[NullRun, RunRow, dict[str, Any]]:
    """One null run (and its provenance) from an lm-eval results dict of a ``peft=null_XX`` run."""
    row = row_from_results(results, "null", task)
    adapter = row.toolfid.get("adapter")
    marker = read_marker(adapter) if adapter else None
    if marker is None:
        raise ToolfidError(f"results for adapter {adapter!r} are not from a toolfid null adapter ({NULL_MARKER} missing)")
    run = NullRun(name=Path(adapter).name, seed=int(marker["run_seed"]), multiplier=float(marker["multiplier"]),
                  n_cases=n_cases(results, row),
                  metrics={k: float(v) for k, v in row.metrics.items()  # an undefined metric is left out
                           if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)})
    return run, row, marker


def calibration_from_results(all_results: list[dict[str, Any]], task: str | None = None) -> Calibration:
    """Fit a calibration from lm-eval results of null-adapter runs (all on one base and case set)."""
    runs: list[NullRun] = []
    keys: set[str] = set()
    shapes: set[str] = set()
    like_norms: list[float] = []
    run_key: dict[str, Any] = {}
    seeds: set[int] = set()
    for results in all_results:
        run, row, marker = null_run_from_results(results, task)
        run_key = row.toolfid.get("run_key") or {}
        keys.add(json.dumps(run_key, sort_keys=True))
        shapes.add(marker["like_shape"])
        like_norms.append(float(marker["like_update_norm"]))
        seeds.add(int(marker["seed"]))
        runs.append(run)
    if len(keys) > 1:
        raise ToolfidError("null runs disagree on base, case set, prompt or generation settings: fit them separately")
    if len(shapes) > 1:
        raise ToolfidError("null runs come from adapters of different shapes: fit them separately")
    if max(like_norms) - min(like_norms) > 1e-9 * max(like_norms):
        raise ToolfidError(f"null runs imitate adapters of different update norms ({min(like_norms):.4g} … "
                           f"{max(like_norms):.4g}): fit them separately")
    provenance = {**run_key, "adapter_shape": shapes.pop(), "adapter_update_norm": like_norms[0],
                  "norm_rtol": NORM_RTOL, "seeds": sorted(seeds),
                  "runs_per_multiplier": _runs_per_multiplier(runs), "versions": _versions()}
    return fit(runs, provenance)


def _runs_per_multiplier(runs: list[NullRun]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in runs:
        counts[f"{r.multiplier:g}"] = counts.get(f"{r.multiplier:g}", 0) + 1
    return dict(sorted(counts.items()))


def find_results_files(paths: list[str]) -> list[Path]:
    """Every ``results*.json`` under the paths, each real file once (overlapping paths, links resolved)."""
    files: list[Path] = []
    seen: set[Path] = set()
    for p in map(lambda x: Path(x).expanduser(), paths):
        if p.is_dir():
            found = sorted(p.rglob("results*.json"))
        elif p.is_file():
            found = [p]
        else:
            raise ToolfidError(f"no such results file or folder: {p}")
        for file in found:
            real = file.resolve()
            if real not in seen:
                seen.add(real)
                files.append(file)
    return files


@dataclass
class ResultsScan:
    """What ``--from-results`` found: the null runs it uses and why every other file was skipped."""

    usable: list[dict[str, Any]] = field(default_factory=list)
    used: list[Path] = field(default_factory=list)
    skipped: dict[str, list[Path]] = field(default_factory=dict)

    def skip(self, reason: str, path: Path) -> None:
        self.skipped.setdefault(reason, []).append(path)

    def describe(self) -> str:
        n_skipped = sum(map(len, self.skipped.values()))
        why = ", ".join(f"{len(v)} {k}" for k, v in sorted(self.skipped.items()))
        return (f"used {len(self.used)} null-run results file(s); skipped {n_skipped}"
                + (f" ({why})" if why else ""))


def scan_results(paths: list[str], task: str | None = None) -> ResultsScan:
    """Sort results files into usable null runs and skipped ones (counted by reason).

    Skipped: ``*.scored.json`` (outputs of ``toolfid score``), unreadable files, results of other
    tasks, base runs, runs of ordinary adapters, and a second result of the same null adapter
    (the same file reached twice, a copy, or a re-run: one null adapter is one draw).
    """
    scan = ResultsScan()
    newest_first: list[tuple[float, Path, dict[str, Any], tuple[Any, ...]]] = []
    for file in find_results_files(paths):
        if file.name.endswith(".scored.json"):
            scan.skip("scored", file)
            continue
        try:
            results = load_results(file)
            if not isinstance(results, dict):
                raise ToolfidError(f"{file}: not an lm-eval results object")
            row = row_from_results(results, str(file), task)
        except ToolfidError:
            scan.skip("other task or unreadable", file)
            continue
        adapter = row.toolfid.get("adapter")
        if not adapter:
            scan.skip("base run", file)
            continue
        marker = read_marker(adapter)
        if marker is None:
            scan.skip("not a null adapter", file)
            continue
        identity = (marker["seed"], marker["run_seed"], float(marker["multiplier"]), marker["like_shape"],
                    float(marker["like_update_norm"]), row.task)
        stamp = results.get("date")
        newest_first.append((-float(stamp) if isinstance(stamp, (int, float)) else 0.0, file, results, identity))
    seen: set[tuple[Any, ...]] = set()
    for _, file, results, identity in sorted(newest_first, key=lambda t: (t[0], str(t[1]))):
        if identity in seen:
            scan.skip("duplicate null run", file)
            continue
        seen.add(identity)
        scan.usable.append(results)
        scan.used.append(file)
    return scan


def calibrate_from_results(paths: list[str], out: Path, task: str | None = None,
                           scan: ResultsScan | None = None) -> Calibration:
    """Fit from ``lm_eval`` results files; base runs, other tasks, scored files and duplicates are skipped."""
    scan = scan or scan_results(paths, task)
    log.info("toolfid calibrate: %s", scan.describe())
    if not scan.usable:
        raise ToolfidError(f"no null-adapter results (runs with peft=…/null_XX) under {', '.join(paths)}: "
                           f"{scan.describe()}")
    calibration = calibration_from_results(scan.usable, task)
    write_calibration(calibration, out)
    return calibration


def write_calibration(calibration: Calibration, out: Path) -> None:
    atomic_write_text(out, calibration.to_json())


def write_fit(results: list[dict[str, Any]], task: str, out: Path) -> Calibration:
    """The nulls' lm-eval results (a session just ran them) fitted and written to ``out``."""
    calibration = calibration_from_results(results, task)
    write_calibration(calibration, out)
    return calibration

# --- scoring existing results --------------------------------------------------------------

def summary_from_row(row: RunRow, n: int) -> Summary:
    """The run's Summary exactly as its finish step stored it (results metadata ``toolfid.summary``)."""
    stored = row.toolfid.get("summary")
    if not isinstance(stored, dict):
        raise ToolfidError(f"{row.label}: the results carry no toolfid summary (made by an older version?): "
                           "re-run the adapter")
    return Summary.model_validate({**stored, "outcome_counts": row.toolfid.get("outcome_counts", {})})


def score_results(results_path: str, calibration_path: str, out: Path | None = None,
                  config: VerdictConfig | None = None, alpha: float = DEFAULT_ALPHA) -> tuple[Path, dict[str, Any]]:
    """z and the verdict for an existing lm-eval results file, written to a new file."""
    from lm_eval_toolfid.pairing.identity import RunKey
    src = Path(results_path)
    results = load_results(src)
    row = row_from_results(results, str(src))
    calibration = load_calibration(calibration_path)
    key = row.toolfid.get("run_key")
    if not key:
        raise ToolfidError(f"{src}: no toolfid provenance (run_key) in the results; was it made by this task?")
    calibration.check_compatible(RunKey(**key), row.toolfid.get("adapter"))
    summary = summary_from_row(row, n_cases(results, row))
    config = config or VerdictConfig(**(row.toolfid.get("verdict_config") or {}))
    null = calibration.compare(summary, config, alpha=alpha)
    verdict = judge(summary, config, null)
    scored = {"json_valid_z": null.z, "json_valid_rank_p": null.rank_p,
              "z_profile": calibration.z_profile(summary.json_valid_rate, n=summary.n),
              "null": null.model_dump(), "verdict": verdict.as_record(),
              "calibration": str(calibration_path)}
    results = dict(results)
    results["toolfid_score"] = scored
    target = out or src.with_name(src.stem + ".scored.json")
    if target.resolve() == src.resolve():
        raise ToolfidError("refusing to overwrite the input results file; give another --output")
    atomic_write_text(target, json.dumps(results, indent=2, default=str))
    return target, scored

