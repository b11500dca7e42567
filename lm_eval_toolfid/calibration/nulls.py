"""Null adapters: K PEFT folders per scale multiplier, shaped like a real adapter, with random
directions whose per-module update norm ‖B·A‖_F matches the real one × multiplier ("same-size
update, random direction"). The same seed gives byte-identical files. What one calibration asks for (how many,
which seed and multipliers, where the nulls and the fit go) is a frozen :class:`CalibrationSpec`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm_eval_toolfid.calibration.adapters import adapter_shape, module_pairs, module_update_norms, update_norm
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.fsutil import atomic_write_bytes, atomic_write_text
from lm_eval_toolfid.reporting.view_store import ViewResult, lm_eval_sample_line

log = logging.getLogger("lm_eval.toolfid")


NULL_MARKER = "toolfid_null.json"
DEFAULT_MULTIPLIERS = (0.5, 1.0, 2.0)


@dataclass(frozen=True)
class CalibrationSpec:
    """K null adapters per multiplier, shaped like the real adapter, run after the base view and fitted into
    ``out`` (``toolfid run --null-runs``, ``toolfid calibrate``): plain values, part of a run's plan; a session that
    loads the base runs them (:meth:`lm_eval_toolfid.run.session.ModelSession.calibrate`)."""

    runs: int
    out: Path
    """The calibration JSON."""
    seed: int = 0
    multipliers: tuple[float, ...] = DEFAULT_MULTIPLIERS
    null_dir: Path | None = None
    """Where the null adapters go (default: ``null_adapters`` beside ``out``)."""

    @property
    def null_folder(self) -> Path:
        return self.null_dir or self.out.parent / "null_adapters"

    @property
    def samples_folder(self) -> Path:
        """Where each null's per-case answers go (``null_XX.jsonl``, lm-eval sample lines): beside ``out``."""
        return self.out.parent / "null_samples"

    def progress_labels(self) -> list[str]:
        """The null views this calibration adds to a run's progress, in order (named as the null adapters)."""
        return [f"null_{i:02d}" for i in range(self.runs * len(self.multipliers))]

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

    from lm_eval_toolfid.calibration.adapters import check_adapter

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
    pairs = module_pairs(real)
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
                target, current = multiplier * norms[prefix], update_norm(a, b)
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


def make_nulls(spec: CalibrationSpec, like: str, base: str) -> list[Path]:
    """The spec's null adapters, shaped like ``like``, written to its null folder."""
    return make_null_adapters(like, spec.runs, spec.null_folder, seed=spec.seed, multipliers=spec.multipliers,
                              base=base)


def keep_null_view(spec: CalibrationSpec, view: ViewResult) -> Path:
    """A null's per-case answers (lm-eval sample lines, as every view's ``samples.jsonl``) kept as
    ``spec.samples_folder/NULL.jsonl``: what the random adapter answered, case by case. Not in the adapter's folder
    (its content is its identity) and not as a results file (a run folder's ``results*.json`` are its views)."""
    path = spec.samples_folder / f"{view.label}.jsonl"
    atomic_write_text(path, "".join(lm_eval_sample_line(sample) for sample in view.samples))
    return path


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

