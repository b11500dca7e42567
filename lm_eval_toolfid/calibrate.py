"""Null adapters and the calibration workflows (in-process, post hoc from results, scoring).

- ``make_null_adapters``: K PEFT folders per scale multiplier, shaped like a real adapter, with
  random directions whose per-module update norm ‖B·A‖_F matches the real one × multiplier.
- ``calibrate_in_process``: load the base once, swap each null's weights into the loaded
  adapter in place, run the task, fit.
- ``calibrate_from_results``: the same fit from ordinary ``lm_eval ... peft=null_XX`` results.
- ``score_results``: add z and the verdict to existing lm-eval results, into a new file.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from .calibration import Calibration, NullRun, adapter_shape, fit, load_calibration
from .errors import ToolfidError
from .records import Summary
from .report import RunRow, load_results, n_cases, row_from_results
from .verdict import VerdictConfig, judge

NULL_MARKER = "toolfid_null.json"
DEFAULT_MULTIPLIERS = (0.5, 1.0, 2.0)


# --- null adapters -------------------------------------------------------------------------

def _module_pairs(state: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """module prefix → (lora_A key, lora_B key)."""
    pairs: dict[str, tuple[str, str]] = {}
    for key in sorted(state):
        if ".lora_A." in key:
            prefix = key.split(".lora_A.")[0]
            b_key = key.replace(".lora_A.", ".lora_B.")
            if b_key not in state:
                raise ToolfidError(f"adapter weights have {key} without its lora_B partner")
            pairs[prefix] = (key, b_key)
    if not pairs:
        raise ToolfidError("adapter has no LoRA A/B weight pairs (only LoRA adapters can be calibrated)")
    return pairs


def _update_norm(a: Any, b: Any) -> float:
    """‖B·A‖_F computed through r×r matrices: tr((BᵀB)(AAᵀ))."""
    a64, b64 = a.double(), b.double()
    return float(((b64.T @ b64) * (a64 @ a64.T)).sum().clamp_min(0).sqrt())


def _seed_for(seed: int, multiplier: float, index: int) -> int:
    digest = hashlib.sha256(f"{seed}:{multiplier:g}:{index}".encode()).hexdigest()
    return int(digest[:15], 16)


def make_null_adapters(like: str | Path, runs: int, out: str | Path, seed: int = 0,
                       multipliers: tuple[float, ...] = DEFAULT_MULTIPLIERS) -> list[Path]:
    """Write ``runs`` null adapters per multiplier; the same seed gives byte-identical files."""
    import torch
    from safetensors.torch import load_file, save_file

    from .runner import check_adapter

    like_dir = Path(like).expanduser()
    check_adapter(str(like_dir))
    weights = like_dir / "adapter_model.safetensors"
    if not weights.is_file():
        raise ToolfidError(f"{like_dir}: null adapters need adapter_model.safetensors")
    real = load_file(str(weights))
    pairs = _module_pairs(real)
    shape = adapter_shape(like_dir)
    lora_keys = {key for pair in pairs.values() for key in pair}
    others = {k: v for k, v in real.items() if k not in lora_keys}  # non-LoRA tensors (e.g. modules_to_save) kept
    out_dir = Path(out).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for multiplier in multipliers:
        for index in range(runs):
            run_seed = _seed_for(seed, multiplier, index)
            gen = torch.Generator().manual_seed(run_seed)
            state: dict[str, Any] = dict(others)
            for a_key, b_key in pairs.values():
                a_real, b_real = real[a_key].float(), real[b_key].float()
                a = torch.randn(a_real.shape, generator=gen, dtype=torch.float32)
                b = torch.randn(b_real.shape, generator=gen, dtype=torch.float32)
                target, current = multiplier * _update_norm(a_real, b_real), _update_norm(a, b)
                scale = (target / current) ** 0.5 if current > 0 else 0.0
                state[a_key] = (a * scale).to(real[a_key].dtype).contiguous()
                state[b_key] = (b * scale).to(real[b_key].dtype).contiguous()
            folder = out_dir / f"null_{len(written):02d}"
            folder.mkdir(exist_ok=True)
            save_file(dict(sorted(state.items())), str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
            shutil.copyfile(like_dir / "adapter_config.json", folder / "adapter_config.json")
            marker = {"seed": seed, "run_seed": run_seed, "index": index, "multiplier": multiplier,
                      "like_shape": shape["hash"], "like": shape["summary"]}
            (folder / NULL_MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            written.append(folder)
    return written


def read_marker(adapter_dir: str | Path) -> dict[str, Any] | None:
    path = Path(adapter_dir).expanduser() / NULL_MARKER
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


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
                  metrics={k: float(v) for k, v in row.metrics.items() if isinstance(v, (int, float))})
    return run, row, marker


def calibration_from_results(all_results: list[dict[str, Any]], task: str | None = None) -> Calibration:
    """Fit a calibration from lm-eval results of null-adapter runs (all on one base and case set)."""
    runs: list[NullRun] = []
    keys: set[str] = set()
    shapes: set[str] = set()
    run_key: dict[str, Any] = {}
    seeds: set[int] = set()
    for results in all_results:
        run, row, marker = null_run_from_results(results, task)
        run_key = row.toolfid.get("run_key") or {}
        keys.add(json.dumps(run_key, sort_keys=True))
        shapes.add(marker["like_shape"])
        seeds.add(int(marker["seed"]))
        runs.append(run)
    if len(keys) > 1:
        raise ToolfidError("null runs disagree on base, case set, prompt or generation settings: fit them separately")
    if len(shapes) > 1:
        raise ToolfidError("null runs come from adapters of different shapes: fit them separately")
    provenance = {**run_key, "adapter_shape": shapes.pop(), "seeds": sorted(seeds),
                  "runs_per_multiplier": _runs_per_multiplier(runs), "versions": _versions()}
    return fit(runs, provenance)


def _runs_per_multiplier(runs: list[NullRun]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in runs:
        counts[f"{r.multiplier:g}"] = counts.get(f"{r.multiplier:g}", 0) + 1
    return dict(sorted(counts.items()))


def find_results_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.rglob("results*.json"))
        elif p.is_file():
            files.append(p)
        else:
            raise ToolfidError(f"no such results file or folder: {p}")
    return files


def calibrate_from_results(paths: list[str], out: Path, task: str | None = None) -> Calibration:
    """Fit from ``lm_eval`` results files; base runs and non-null adapters in the folders are skipped."""
    usable = []
    for file in find_results_files(paths):
        results = load_results(file)
        row = row_from_results(results, str(file), task)
        adapter = row.toolfid.get("adapter")
        if adapter and read_marker(adapter) is not None:
            usable.append(results)
    if not usable:
        raise ToolfidError(f"no null-adapter results (runs with peft=…/null_XX) under {', '.join(paths)}")
    calibration = calibration_from_results(usable, task)
    write_calibration(calibration, out)
    return calibration


def write_calibration(calibration: Calibration, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(calibration.to_json(), encoding="utf-8")


def calibrate_in_process(base: str, adapter: str, runs: int, out: Path, task: str, metadata: dict[str, Any],
                         seed: int = 0, batch_size: int | str = 16,
                         multipliers: tuple[float, ...] = DEFAULT_MULTIPLIERS,
                         null_dir: Path | None = None, session: Any = None,
                         run_base: bool = True) -> Calibration:
    """Load the base once (with the real adapter's LoRA modules), swap each null in, run, fit.

    With ``session`` (a loaded :class:`~lm_eval_toolfid.runner.ModelSession` whose ``default``
    adapter is ``adapter``), no model is loaded and the real weights are restored afterwards;
    ``run_base=False`` when that session already ran the base view (the reference exists).
    """
    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    from .runner import ModelSession, evaluate_base

    null_dir = null_dir or out.parent / "null_adapters"
    paths = make_null_adapters(adapter, runs, null_dir, seed=seed, multipliers=multipliers)
    session = session or ModelSession(base, adapter, batch_size=batch_size)
    session.activate("default")
    real = {k: v.detach().clone() for k, v in get_peft_model_state_dict(session.peft_model, adapter_name="default").items()}
    if run_base:  # the base reference every null run pairs with
        evaluate_base(session, task, metadata)
    results = []
    try:
        for path in paths:
            state = load_file(str(path / "adapter_model.safetensors"))
            set_peft_model_state_dict(session.peft_model, state, adapter_name="default")
            results.append(session.evaluate(task, metadata, adapter=str(path), label=path.name).results)
    finally:
        set_peft_model_state_dict(session.peft_model, real, adapter_name="default")
    calibration = calibration_from_results(results, task)
    write_calibration(calibration, out)
    return calibration


# --- scoring existing results --------------------------------------------------------------

def summary_from_row(row: RunRow, n: int) -> Summary:
    """The aggregated metrics of a results file, as the Summary the verdict rule reads."""
    m = row.metric
    paired = m("validity_delta") is not None
    valid = m("json_valid_rate") or 0.0
    return Summary(n=n, json_valid_rate=valid, parse_rate=m("parse_rate") or 0.0,
                   hallucination_rate=m("hallucination_rate") or 0.0, n_valid=round(valid * n),
                   outcome_counts=row.toolfid.get("outcome_counts", {}), paired=paired,
                   base_json_valid_rate=m("base_json_valid_rate"), validity_delta=m("validity_delta"),
                   arg_disagreement=m("arg_disagreement"))


def score_results(results_path: str, calibration_path: str, out: Path | None = None,
                  config: VerdictConfig | None = None) -> tuple[Path, dict[str, Any]]:
    """z and the verdict for an existing lm-eval results file, written to a new file."""
    from .pairing import RunKey
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
    null = calibration.compare(summary, config)
    verdict = judge(summary, config, null)
    scored = {"json_valid_z": null.z, "z_profile": calibration.z_profile(summary.json_valid_rate),
              "null": null.model_dump(), "verdict": verdict.model_dump(mode="json"),
              "calibration": str(calibration_path)}
    results = dict(results)
    results["toolfid_score"] = scored
    target = out or src.with_name(src.stem + ".scored.json")
    if target.resolve() == src.resolve():
        raise ToolfidError("refusing to overwrite the input results file; give another --output")
    target.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    return target, scored
