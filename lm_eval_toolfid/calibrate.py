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
import math
import logging
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from .calibration import (DEFAULT_ALPHA, NORM_RTOL, Calibration, NullRun, _module_pairs, _update_norm,  # noqa: F401
                          adapter_shape, adapter_update_norm, fit, load_calibration, min_runs, module_update_norms)
from .errors import ToolfidError
from .fsutil import atomic_write_bytes, atomic_write_text
from .records import Summary
from .report import RunRow, load_results, n_cases, row_from_results
from .verdict import VerdictConfig, judge, label_of

log = logging.getLogger("lm_eval.toolfid")

NULL_MARKER = "toolfid_null.json"
DEFAULT_MULTIPLIERS = (0.5, 1.0, 2.0)


# --- null adapters -------------------------------------------------------------------------
#
# Every tensor of the real adapter is replaced, by kind (see docs/calibration.md):
# - LoRA pairs (``lora_A``/``lora_B``, ``lora_embedding_A``/``lora_embedding_B``): a random
#   direction whose update norm ‖B·A‖_F is the real one × multiplier;
# - DoRA magnitudes (``lora_magnitude_vector``): the base weight's own column norms, so only the
#   random direction acts (this is what PEFT initialises a DoRA magnitude to before training);
# - full tensors (``modules_to_save`` copies, trainable biases, saved ``base_layer`` weights):
#   the base model's own tensor plus random noise whose norm is ‖real − base‖_F × multiplier.
# Anything else is refused: copying an unknown tensor unchanged would leak what the adapter learned.

_MAGNITUDE = ".lora_magnitude_vector"
_PREFIX = "base_model.model."


def _classify(real: dict[str, Any], pairs: dict[str, tuple[str, str]]) -> tuple[list[str], list[str]]:
    """The non-pair keys split into (DoRA magnitudes, full tensors); anything else is refused."""
    pair_keys = {k for pair in pairs.values() for k in pair}
    magnitudes, full = [], []
    for key in sorted(set(real) - pair_keys):
        if key.endswith(_MAGNITUDE) or (_MAGNITUDE + ".") in key:
            magnitudes.append(key)
        elif key.startswith(_PREFIX) and key.endswith((".weight", ".bias")) and ".lora_" not in key:
            full.append(key)
        else:
            raise ToolfidError(f"adapter tensor {key} is of a kind null adapters cannot randomise "
                               "(only LoRA/embedding-LoRA pairs, DoRA magnitudes, modules_to_save and biases)")
    return magnitudes, full


def _base_key(adapter_key: str) -> str:
    """``base_model.model.X.base_layer.weight`` → ``X.weight``; a DoRA magnitude → its layer's weight."""
    key = adapter_key[len(_PREFIX):] if adapter_key.startswith(_PREFIX) else adapter_key
    if _MAGNITUDE in key:
        key = key.split(_MAGNITUDE)[0] + ".weight"
    return key.replace(".base_layer.", ".").replace(".modules_to_save.", ".")


def _base_dir(base: str | None, like_dir: Path, needs: str) -> Path:
    cfg = json.loads((like_dir / "adapter_config.json").read_text(encoding="utf-8"))
    name = base or cfg.get("base_model_name_or_path")
    hint = (f"{like_dir} has {needs}: null adapters need the base model's weights; "
            "pass --base BASE (a local model folder or a cached hub id)")
    if not name:
        raise ToolfidError(hint)
    path = Path(str(name)).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(str(name), local_files_only=True, allow_patterns=["*.safetensors", "*.json"]))
    except Exception:
        raise ToolfidError(hint + f" ({name} is neither a folder nor in the local hub cache)") from None


def _base_tensors(base_dir: Path, keys: set[str]) -> dict[str, Any]:
    """The named tensors of a base model folder (single or sharded safetensors; tied lm_head resolved)."""
    from safetensors import SafetensorError, safe_open

    files = sorted(base_dir.glob("*.safetensors"))
    if not files:
        raise ToolfidError(f"base model {base_dir} has no *.safetensors weights (needed to build null adapters)")
    index: dict[str, Path] = {}
    aliases = {"lm_head.weight": "model.embed_tokens.weight"}  # tied embeddings store one of the two
    out: dict[str, Any] = {}
    file = files[0]
    try:
        for file in files:
            with safe_open(str(file), framework="pt") as fh:
                index.update({k: file for k in fh.keys()})
        for key in sorted(keys):
            source = key if key in index else aliases.get(key)
            if source not in index:
                raise ToolfidError(f"base model {base_dir} has no tensor {key}: is it the adapter's base model?")
            file = index[source]
            with safe_open(str(file), framework="pt") as fh:
                out[key] = fh.get_tensor(source)
    except (SafetensorError, OSError) as exc:
        raise ToolfidError(f"{file}: unreadable safetensors file ({exc})") from None
    return out


def _dora_norm(weight: Any, embedding: bool, fan_in_fan_out: bool) -> Any:
    """Column norms as PEFT's DoRA computes them (Linear: per output row; Embedding: per embedding dim)."""
    w = weight.double()
    if embedding:
        return w.norm(dim=0)
    if fan_in_fan_out:
        w = w.T
    return w.reshape(w.shape[0], -1).norm(dim=1)


def _seed_for(seed: int, multiplier: float, index: int) -> int:
    digest = hashlib.sha256(f"{seed}:{multiplier:g}:{index}".encode()).hexdigest()
    return int(digest[:15], 16)


def make_null_adapters(like: str | Path, runs: int, out: str | Path, seed: int = 0,
                       multipliers: tuple[float, ...] = DEFAULT_MULTIPLIERS,
                       base: str | None = None) -> list[Path]:
    """Write ``runs`` null adapters per multiplier; the same seed gives byte-identical files.

    ``base`` (a model folder or cached hub id; default: the adapter config's
    ``base_model_name_or_path``) is read only when the adapter has DoRA magnitudes or full tensors.
    """
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save

    from .runner import check_adapter

    like_dir = Path(like).expanduser()
    check_adapter(str(like_dir))
    weights = like_dir / "adapter_model.safetensors"
    if not weights.is_file():
        raise ToolfidError(f"{like_dir}: null adapters need adapter_model.safetensors")
    if runs < 1:
        raise ToolfidError(f"--runs must be at least 1 (got {runs})")
    try:
        real = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ToolfidError(f"{weights}: unreadable safetensors file ({exc})") from None
    config = json.loads((like_dir / "adapter_config.json").read_text(encoding="utf-8"))
    if config.get("peft_type") != "LORA":
        raise ToolfidError(f"{like_dir}: peft_type {config.get('peft_type')!r}: only LoRA adapters can be calibrated")
    pairs = _module_pairs(real)
    magnitudes, full = _classify(real, pairs)
    base_state: dict[str, Any] = {}
    if magnitudes or full:
        needs = "DoRA magnitudes" if magnitudes else f"full tensors ({full[0]})"
        base_state = _base_tensors(_base_dir(base, like_dir, needs), {_base_key(k) for k in magnitudes + full})
        for key in magnitudes + full:
            if key in full and tuple(base_state[_base_key(key)].shape) != tuple(real[key].shape):
                raise ToolfidError(f"adapter tensor {key} {tuple(real[key].shape)} does not match the base's "
                                   f"{_base_key(key)} {tuple(base_state[_base_key(key)].shape)}: wrong base model?")
    # what does not depend on the run: DoRA magnitudes (base column norms) and full-tensor deltas
    fixed: dict[str, Any] = {}
    embedding_prefixes = {p for p, (a, _) in pairs.items() if ".lora_embedding_A" in a}
    for key in magnitudes:
        prefix = key.split(_MAGNITUDE)[0]
        norm = _dora_norm(base_state[_base_key(key)], prefix in embedding_prefixes, bool(config.get("fan_in_fan_out")))
        if norm.numel() != real[key].numel():
            raise ToolfidError(f"DoRA magnitude {key} has {real[key].numel()} entries, the base layer's column norms "
                               f"{norm.numel()}: wrong base model?")
        fixed[key] = norm.reshape(real[key].shape).to(real[key].dtype).contiguous()
    full_delta = {k: float((real[k].double() - base_state[_base_key(k)].double()).norm()) for k in full}
    shape = adapter_shape(like_dir)
    norms = module_update_norms(real)
    out_dir = Path(out).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for multiplier in multipliers:
        for index in range(runs):
            run_seed = _seed_for(seed, multiplier, index)
            gen = torch.Generator().manual_seed(run_seed)
            state: dict[str, Any] = dict(fixed)
            for prefix, (a_key, b_key) in pairs.items():
                a = torch.randn(real[a_key].shape, generator=gen, dtype=torch.float32)
                b = torch.randn(real[b_key].shape, generator=gen, dtype=torch.float32)
                target, current = multiplier * norms[prefix], _update_norm(a, b)
                scale = (target / current) ** 0.5 if current > 0 else 0.0
                state[a_key] = (a * scale).to(real[a_key].dtype).contiguous()
                state[b_key] = (b * scale).to(real[b_key].dtype).contiguous()
            for key in full:
                base_t = base_state[_base_key(key)]
                noise = torch.randn(real[key].shape, generator=gen, dtype=torch.float64)
                noise *= multiplier * full_delta[key] / max(float(noise.norm()), 1e-30)
                state[key] = (base_t.double() + noise).to(real[key].dtype).contiguous()
            folder = out_dir / f"null_{len(written):02d}"
            folder.mkdir(exist_ok=True)
            atomic_write_bytes(folder / "adapter_model.safetensors",
                               save(dict(sorted(state.items())), metadata={"format": "pt"}))
            atomic_write_bytes(folder / "adapter_config.json", (like_dir / "adapter_config.json").read_bytes())
            marker = {"seed": seed, "run_seed": run_seed, "index": index, "multiplier": multiplier,
                      "like_shape": shape["hash"], "like": shape["summary"],
                      "like_update_norm": sum(norms.values())}
            atomic_write_text(folder / NULL_MARKER, json.dumps(marker, indent=1, sort_keys=True) + "\n")
            written.append(folder)
    return written


_MARKER_FIELDS = {"seed": int, "run_seed": int, "multiplier": (int, float), "like_shape": str,
                  "like_update_norm": (int, float)}


def read_marker(adapter_dir: str | Path) -> dict[str, Any] | None:
    """A null adapter's marker (None for an ordinary adapter); a damaged marker is a one-line error."""
    path = Path(adapter_dir).expanduser() / NULL_MARKER
    if not path.is_file():
        return None
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ToolfidError(f"{path}: unreadable null-adapter marker ({exc}); re-run make-null-adapters") from None
    if not isinstance(marker, dict):
        raise ToolfidError(f"{path}: null-adapter marker is not a JSON object; re-run make-null-adapters")
    for name, kind in _MARKER_FIELDS.items():
        value = marker.get(name)
        if name not in marker or isinstance(value, bool) or not isinstance(value, kind):
            what = "missing" if name not in marker else f"not a {getattr(kind, '__name__', 'number')}"
            raise ToolfidError(f"{path}: null-adapter marker field {name!r} is {what} "
                               "(made by an older toolfid?); re-run make-null-adapters")
    if not (math.isfinite(marker["multiplier"]) and marker["multiplier"] > 0
            and math.isfinite(marker["like_update_norm"]) and marker["like_update_norm"] >= 0):
        raise ToolfidError(f"{path}: null-adapter marker has a non-finite or negative multiplier/update norm")
    return marker


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
    paths = make_null_adapters(adapter, runs, null_dir, seed=seed, multipliers=multipliers, base=base)
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
    """The run's Summary exactly as its finish step stored it (results metadata ``toolfid.summary``)."""
    stored = row.toolfid.get("summary")
    if not isinstance(stored, dict):
        raise ToolfidError(f"{row.label}: the results carry no toolfid summary (made by an older version?): "
                           "re-run the adapter")
    return Summary.model_validate({**stored, "outcome_counts": row.toolfid.get("outcome_counts", {})})


def score_results(results_path: str, calibration_path: str, out: Path | None = None,
                  config: VerdictConfig | None = None, alpha: float = DEFAULT_ALPHA) -> tuple[Path, dict[str, Any]]:
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

