"""Find and read lm-eval results (and their samples) from files and folders.

Two layouts are understood:

- ``lm_eval --output_path OUT``: ``OUT/<model_dir>/results_<time>.json`` with
  ``samples_<task>_<time>.jsonl`` beside it;
- ``toolfid run --output OUT``: ``OUT/<label>/results.json`` with ``samples.jsonl`` beside it.

A results file may hold other tasks too (hellaswag, gsm8k...): their headline metric is kept.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.reporting.results import RunRow, row_from_results

TOOLFID_PREFIX = "tool_use_fidelity"
_NOT_METRICS = {"alias", "name", "sample_len", "samples", " ", ""}


@dataclass
class Run:
    """One results file: one model (+ adapter), possibly several tasks."""

    source: Path
    results: dict[str, Any]
    model: str
    adapter: str | None
    label: str
    toolfid_task: str | None = None
    row: RunRow | None = None
    stderr: dict[str, float] = field(default_factory=dict)
    other: dict[str, tuple[str, float | None]] = field(default_factory=dict)
    samples_path: Path | None = None
    n: int = 0
    date: float | None = None
    derived_ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Intervals computed from the per-case samples (e.g. the paired validity delta) when lm-eval gave none."""

    @property
    def toolfid(self) -> dict[str, Any]:
        return self.row.toolfid if self.row else {}

    @property
    def metrics(self) -> dict[str, Any]:
        return self.row.metrics if self.row else {}

    @property
    def verdict(self) -> dict[str, Any] | None:
        return self.toolfid.get("verdict")

    @property
    def verdict_label(self) -> str:
        if self.row is None or not self.adapter:
            return "—"  # a base run has nothing to judge
        verdict = self.verdict
        if not verdict or verdict.get("passed") is None:
            return "UNDECIDED"
        return "PASS" if verdict["passed"] else "FAIL"

    @property
    def case_set(self) -> str | None:
        return self.toolfid.get("case_set") or (self.toolfid.get("run_key") or {}).get("case_set")

    @property
    def base_id(self) -> str:
        """The base model as shown: its name (hub id or folder), with the content fingerprint of a local folder."""
        base = (self.toolfid.get("run_key") or {}).get("base") or {}
        name = base.get("pretrained") or self.model
        return f"{name} @{base['fingerprint']}" if base.get("fingerprint") else name

    @property
    def base_key(self) -> str:
        """What makes two runs' bases the same base (the task's identity: a local folder's content, not its path)."""
        base = (self.toolfid.get("run_key") or {}).get("base")
        return json.dumps(base, sort_keys=True) if base else _norm(self.model)

    @property
    def identity(self) -> str:
        """Same run found twice (a copy, a scored copy) has the same identity."""
        tasks = sorted((self.results.get("results") or {}).keys())
        return json.dumps([_norm(self.model), _norm(self.adapter), self.date, tasks], default=str)

    def ci(self, metric: str) -> tuple[float, float] | None:
        """95% interval, always inside the metric's range: the run's own when it stores one (the paired deltas:
        Tango / Newcombe, as the verdict uses); for a rate, Wilson's over its denominator (the cases it was computed
        on); else ±1.96·stderr cut to the range (a delta's is [-1, 1])."""
        summary = self.toolfid.get("summary") or {}
        stored = summary.get(f"{metric}_ci")  # the run's own interval (Tango)
        if isinstance(stored, (list, tuple)) and len(stored) == 2 and all(isinstance(x, (int, float)) for x in stored):
            return float(stored[0]), float(stored[1])
        value = self.metrics.get(metric)
        if not isinstance(value, (int, float)):
            return None
        bounds = metric_range(metric)
        if metric in self.derived_ci:
            return self.derived_ci[metric]
        if bounds == (0.0, 1.0) and metric not in ("validity_mcnemar_p",):
            n = (summary.get("denominators") or {}).get(metric)
            if not isinstance(n, int) and metric in ("json_valid_rate", "base_json_valid_rate", "parse_rate"):
                n = self.n
            if isinstance(n, int) and n > 0 and 0.0 <= value <= 1.0:
                return wilson(value, n)
        se = self.stderr.get(metric)
        if se is not None and se > 0 and bounds is not None:
            return max(bounds[0], value - 1.96 * se), min(bounds[1], value + 1.96 * se)
        return None


def metric_range(metric: str) -> tuple[float, float] | None:
    """The values a metric can take: a difference of two rates [-1, 1], a z-score unbounded (None), the rest
    (rates, shares, p-values) [0, 1]."""
    if metric == "json_valid_z":
        return None
    if metric.endswith("_delta"):
        return (-1.0, 1.0)
    return (0.0, 1.0)


def wilson(rate: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial rate."""
    if n <= 0:
        return (0.0, 1.0)
    denom = 1 + z * z / n
    centre = (rate + z * z / (2 * n)) / denom
    half = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _norm(path: str | None) -> str | None:
    if not path:
        return None
    expanded = os.path.expanduser(path)
    if os.path.exists(expanded):
        return os.path.realpath(expanded)
    return path.rstrip("/")


def parse_model_args(value: Any) -> dict[str, str]:
    """lm-eval stores ``config.model_args`` as the CLI string or as a dict."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items() if v is not None}
    if isinstance(value, str):
        pairs = [p.partition("=") for p in value.split(",") if "=" in p]
        return {k.strip(): v.strip() for k, _, v in pairs}
    return {}


def results_files(paths: list[str | Path]) -> list[Path]:
    """Every results JSON under the given files/folders (``results*.json``; scored copies included)."""
    files: list[Path] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            found = sorted(f for f in p.rglob("results*.json") if f.is_file())
            if not found:
                raise ToolfidError(f"{p}: no lm-eval results (results*.json) in this folder; "
                                   "give the --output_path of an lm_eval run or the --output of toolfid run")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise ToolfidError(f"{p}: no such results file or folder")
    return files


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ToolfidError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ToolfidError(f"{path}: not valid JSON ({exc}); is it an lm-eval results file?") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        raise ToolfidError(f"{path}: not an lm-eval results file (no 'results' object)")
    return data


def _samples_for(results_file: Path, task: str) -> Path | None:
    if results_file.name == "results.json" or results_file.name.startswith("results.scored"):
        candidate = results_file.with_name("samples.jsonl")
        return candidate if candidate.is_file() else None
    stem = results_file.name[len("results_"):] if results_file.name.startswith("results_") else ""
    stamp = stem.split(".scored")[0].removesuffix(".json")
    if stamp:
        candidate = results_file.with_name(f"samples_{task}_{stamp}.jsonl")
        if candidate.is_file():
            return candidate
    found = sorted(results_file.parent.glob(f"samples_{task}_*.jsonl"))
    return found[-1] if len(found) == 1 else None


def _headline(task_results: dict[str, Any]) -> tuple[str, float | None]:
    """The first metric lm-eval lists for a task (``acc,none`` → ``acc``)."""
    for key, value in task_results.items():
        if key in _NOT_METRICS or "_stderr" in key:
            continue
        metric = key.split(",")[0]
        return metric, float(value) if isinstance(value, (int, float)) else None
    return "—", None


def read_run(path: Path) -> Run:
    results = _read_json(path)
    cfg = results.get("config") or {}
    args = parse_model_args(cfg.get("model_args"))
    model = args.get("pretrained") or args.get("model") or str(cfg.get("model") or "?")
    adapter = args.get("peft") or None
    all_tasks = results.get("results") or {}
    toolfid_tasks = [t for t in all_tasks if t.startswith(TOOLFID_PREFIX)]
    if adapter is None and args.get("base_url") and toolfid_tasks:  # a served run: adapters are model names
        meta = ((results.get("configs") or {}).get(toolfid_tasks[0]) or {}).get("metadata") or {}
        base_model = meta.get("base_model") if isinstance(meta, dict) else None
        if base_model and str(base_model) != str(args.get("model")):
            model, adapter = str(base_model), str(args.get("model"))
    if path.name == "results.json" or path.name.startswith("results.scored"):
        label = path.parent.name
    else:
        label = Path(adapter).name if adapter else "base"
    run = Run(source=path, results=results, model=model, adapter=adapter, label=label, date=results.get("date"))
    # subtasks of a group that is itself in the results are represented by the group
    grouped = {t for g, subs in (results.get("group_subtasks") or {}).items() if g in all_tasks for t in subs}
    for task, values in all_tasks.items():
        if task.startswith(TOOLFID_PREFIX) or task in grouped or not isinstance(values, dict):
            continue
        run.other[task] = _headline(values)
    if toolfid_tasks:
        task = toolfid_tasks[0]
        run.toolfid_task = task
        try:
            run.row = row_from_results(results, label, task)
        except ToolfidError as exc:
            raise ToolfidError(f"{path}: {exc}") from None
        raw = all_tasks[task]
        run.stderr = {k.split("_stderr")[0]: float(v) for k, v in raw.items()
                      if "_stderr," in k and isinstance(v, (int, float)) and math.isfinite(v)}
        scored = results.get("toolfid_score")
        if isinstance(scored, dict) and scored.get("verdict"):  # toolfid score's z and verdict win
            run.row.toolfid = {**run.row.toolfid, "verdict": scored["verdict"],
                               "z_profile": scored.get("z_profile"), "calibration": scored.get("calibration")}
            if isinstance(scored.get("json_valid_z"), (int, float)):
                run.row.metrics = {**run.row.metrics, "json_valid_z": scored["json_valid_z"]}
        counted = ((results.get("n-samples") or {}).get(task) or {}).get("effective")
        run.n = int(counted or run.toolfid.get("n_cases") or 0)
        run.samples_path = _samples_for(path, task)
    return run


def load_runs(paths: list[str | Path]) -> tuple[list[Run], list[str]]:
    """Every run under ``paths``, duplicates dropped (a scored copy beats its source). Also returns notes."""
    notes: list[str] = []
    by_identity: dict[str, Run] = {}
    for file in results_files(paths):
        run = read_run(file)
        key = run.identity
        seen = by_identity.get(key)
        if seen is None:
            by_identity[key] = run
            continue
        if seen.source.resolve() == run.source.resolve():
            continue
        keep = run if ("toolfid_score" in run.results and "toolfid_score" not in seen.results) else seen
        drop = seen if keep is run else run
        by_identity[key] = keep
        notes.append(f"{drop.source}: same run as {keep.source}; counted once")
    return list(by_identity.values()), notes


def iter_samples(path: Path) -> Iterator[dict[str, Any]]:
    try:
        fh = path.open(encoding="utf-8")
    except OSError as exc:
        raise ToolfidError(f"{path}: cannot read samples ({exc.strerror or exc})") from None
    with fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
            except ValueError:
                raise ToolfidError(f"{path}:{lineno}: not valid JSON; is it an lm-eval samples file?") from None
            if isinstance(sample, dict):
                yield sample
