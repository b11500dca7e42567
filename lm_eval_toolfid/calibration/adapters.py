"""PEFT adapter folders: cheap checks (and their fit to a local base) before any model loads, and
what calibration compares adapters by: their shape (config + tensor shapes) and update norm ‖B·A‖_F.

Everything here reads headers and configs only, except for a weights-only load of a legacy
``adapter_model.bin``: no pickle is ever executed by toolfid (see SECURITY.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
from pathlib import Path
from typing import Any, Mapping

from lm_eval_toolfid.core.errors import ToolfidError

log = logging.getLogger("lm_eval.toolfid")

SAFETENSORS = "adapter_model.safetensors"
PICKLE_BIN = "adapter_model.bin"
_MAX_HEADER = 100 * 1024 * 1024  # a safetensors header larger than this is not a real file


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ToolfidError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ToolfidError(f"{path}: not a text file (expected the {what} as UTF-8 JSON)") from None
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        where = f"{path}:{line}" if line else str(path)
        raise ToolfidError(f"{where}: {what} is not valid JSON ({getattr(exc, 'msg', exc)}); "
                           f"fix or regenerate it") from None
    if not isinstance(data, dict):
        raise ToolfidError(f"{path}: {what} must be a JSON object, got {type(data).__name__}")
    return data


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name → shape from a safetensors header (no tensor data is read)."""
    try:
        with path.open("rb") as fh:
            size = path.stat().st_size
            header_len = int.from_bytes(fh.read(8), "little")
            if size < 8 or header_len <= 0 or header_len > min(_MAX_HEADER, size - 8):
                raise ValueError("bad header length")
            header = json.loads(fh.read(header_len))
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        end = max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
        if 8 + header_len + end > size:  # the header names more bytes than the file holds: cut short
            raise ToolfidError(f"{path}: truncated ({size} bytes; its header describes {8 + header_len + end}); "
                               "copy or re-save the weights")
        return {k: list(v["shape"]) for k, v in tensors.items()}
    except OSError as exc:
        raise ToolfidError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError):
        raise ToolfidError(f"{path}: not a safetensors file (corrupt or truncated); re-save the weights") from None


def peft_loads_bin_weights_only() -> bool:
    """Whether the installed PEFT loads ``adapter_model.bin`` with ``torch.load(weights_only=True)``."""
    try:
        from peft.utils.save_and_load import torch_load
    except ImportError:
        return False
    param = inspect.signature(torch_load).parameters.get("weights_only")
    return param is not None and param.default is True


def bin_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor shapes of a legacy ``adapter_model.bin``, loaded weights-only (no code runs)."""
    import pickle

    import torch

    if not peft_loads_bin_weights_only():
        raise ToolfidError(f"{path}: this PEFT version may unpickle adapter_model.bin with arbitrary code; "
                           f"convert the adapter to {SAFETENSORS} or upgrade peft")
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ToolfidError(f"{path}: refused: the pickle holds more than tensors (weights-only loading); "
                           f"only load adapters you trust, and prefer {SAFETENSORS}") from None
    except Exception as exc:  # noqa: BLE001 - truncated zip, not a torch file, ...
        raise ToolfidError(f"{path}: cannot be read as PyTorch weights ({type(exc).__name__}); "
                           f"re-save the adapter as {SAFETENSORS}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ToolfidError(f"{path}: not an adapter state dict (expected tensor name → tensor)")
    return {str(k): list(v.shape) for k, v in state.items()}


def base_weight_shapes(base: Path) -> dict[str, list[int]] | None:
    """Weight shapes of a local base model from its safetensors headers; None when unknown."""
    single = base / "model.safetensors"
    if single.is_file():
        return safetensors_shapes(single)
    index = base / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index, "safetensors index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise ToolfidError(f"{index}: no weight_map; re-save the base model")
        shapes: dict[str, list[int]] = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = base / str(shard)
            if not shard_path.is_file():
                raise ToolfidError(f"{index}: shard {shard} is missing from {base}")
            shapes.update(safetensors_shapes(shard_path))
        return shapes
    return None  # pytorch_model.bin only, GGUF, ...: toolfid does not open those itself


def _module_of(key: str) -> tuple[str, str] | None:
    """``base_model.model.X.lora_A[.name].weight`` → ("X", "A"); None for other tensors."""
    for part in ("A", "B"):
        marker = f".lora_{part}."
        if marker in key and key.endswith(".weight"):
            module = key.split(marker)[0]
            return module.removeprefix("base_model.model."), part
    return None


def _fit_problem(adapter_shapes: dict[str, list[int]], config: dict[str, Any],
                 base_shapes: dict[str, list[int]]) -> str | None:
    modules = {k.removesuffix(".weight").rsplit(".", 1)[-1] for k in base_shapes}
    targets = config.get("target_modules")
    if isinstance(targets, list) and targets and base_shapes:
        missing = sorted(t for t in targets if isinstance(t, str) and t not in modules
                         and not any(k.removesuffix(".weight").endswith("." + t) for k in base_shapes))
        if missing and len(missing) == len(targets):
            return f"target_modules {missing} name no module of the base"
    fan_in_fan_out = bool(config.get("fan_in_fan_out"))
    for key, shape in adapter_shapes.items():
        found = _module_of(key)
        if found is None or len(shape) != 2:
            continue
        module, part = found
        base_key = module + ".weight"
        base_shape = base_shapes.get(base_key)
        if base_shape is None:
            candidates = [k for k in base_shapes if k.endswith("." + base_key) or base_key.endswith("." + k)]
            base_shape = base_shapes[candidates[0]] if len(candidates) == 1 else None
        if base_shape is None:
            return f"the adapter changes {module}, which the base has no weight for"
        if len(base_shape) != 2:
            continue
        out_f, in_f = (base_shape[1], base_shape[0]) if fan_in_fan_out else (base_shape[0], base_shape[1])
        if part == "A" and shape[1] != in_f:
            return f"{module}: lora_A expects {shape[1]} input features, the base has {in_f}"
        if part == "B" and shape[0] != out_f:
            return f"{module}: lora_B produces {shape[0]} output features, the base has {out_f}"
    return None


def first_non_finite(path: Path) -> str | None:
    """The name of the first tensor of a safetensors file with a NaN or an infinite value; None when all are finite
    (integer tensors always are). Reads the tensors one at a time."""
    import torch
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():
                tensor = fh.get_tensor(name)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    return name
    except Exception as exc:  # noqa: BLE001 - safetensors' own error type too: the file, not a bug
        raise ToolfidError(f"the weights of {path} cannot be read ({type(exc).__name__}: {exc}); re-save it") from None
    return None


PROMPT_LEARNING = {"PREFIX_TUNING", "P_TUNING", "PROMPT_TUNING", "MULTITASK_PROMPT_TUNING", "ADAPTION_PROMPT", "CPT"}
"""PEFT types that add virtual tokens or prompt modules instead of weights: ``toolfid run``'s engine (which feeds the
prompt's tokens and a KV cache of its own) cannot run them; PEFT's own ``generate`` can (``lm_eval --model hf
--model_args peft=``)."""


LM_EVAL_INSTEAD = ("run it with lm_eval --model hf --model_args pretrained=BASE,peft=ADAPTER (PEFT's own generate, "
                   "one model per process), the base in a run of its own")


def _tied(base: str | Path | None) -> bool:
    """The base ties its input embeddings and its lm_head (its config says so, or says nothing: the default)."""
    if base is None or not (Path(base).expanduser() / "config.json").is_file():
        return False
    try:
        config = json.loads((Path(base).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", True)))


def check_engine_adapter(adapter: str | Path, base: str | Path | None = None, alone: bool = False) -> None:
    """An adapter ``toolfid run`` cannot evaluate as the adapter given, beside the base and other adapters in one
    process, is one line naming what it has and what can run it (exit 4, before any model loads):

    - prompt learning (virtual tokens, not weights): the engine feeds the prompt's own tokens;
    - trained biases of the base's layers (``bias="all"`` / ``"lora_only"`` with such tensors saved): PEFT writes them
      into the base's own layers when it loads the adapter, so the base view and every other adapter would run on
      weights that are not the base's;
    - ``modules_to_save`` or trainable tokens on a base whose embeddings and lm_head are tied (PEFT unties them);
    - ``modules_to_save`` or trainable tokens beside other views (``alone`` False): a shared batch runs those
      modules' wrappers switched off for every row; ``--views-together 1`` runs each view alone.
    """
    path = Path(adapter).expanduser()
    config = read_json_object(path / "adapter_config.json", "adapter config")
    peft_type = str(config.get("peft_type", "")).upper()
    if peft_type in PROMPT_LEARNING:
        raise ToolfidError(f"adapter {path} is {peft_type.lower().replace('_', ' ')} (virtual prompt tokens, not "
                           f"weights): toolfid run's engine cannot evaluate it; {LM_EVAL_INSTEAD}")
    keys = list(safetensors_shapes(path / SAFETENSORS)) if (path / SAFETENSORS).is_file() else []
    base_biases = [k for k in keys if k.endswith(".bias") and ".lora_" not in k and "modules_to_save" not in k]
    if base_biases:
        raise ToolfidError(f"adapter {path} trains the base's own biases (bias={config.get('bias')!r}: "
                           f"{base_biases[0]}, {len(base_biases)} in all): PEFT writes them into the base's layers "
                           f"when it loads the adapter, so the base view would not be the base; {LM_EVAL_INSTEAD}")
    saved = [str(m) for m in (config.get("modules_to_save") or [])]
    tokens = config.get("trainable_token_indices")
    what = f"modules_to_save {saved}" if saved else "trainable tokens" if tokens else ""
    if not what:
        return
    if _tied(base) and (tokens or any(m in ("lm_head", "embed_tokens", "wte", "embed_in", "embed_out") for m in saved)):
        raise ToolfidError(f"adapter {path} has {what} on a base whose embeddings and lm_head are tied: toolfid "
                           f"run cannot evaluate it as saved; {LM_EVAL_INSTEAD}")
    if not alone:
        raise ToolfidError(f"adapter {path} has {what}: whole modules of its own that a batch shared with other views "
                           "would not apply to its rows; run with --views-together 1 (each view alone, the same "
                           "answers as PEFT's), or " + LM_EVAL_INSTEAD.replace("run it", "evaluate it"))


def check_adapter(adapter: str | Path, base: str | Path | None = None) -> None:
    """A missing, broken or ill-fitting adapter is a one-line :class:`ToolfidError`.

    With ``base`` a local model folder, the adapter's tensors are checked against the base's
    weight shapes (headers only): an adapter trained for another model fails here, not deep
    inside PEFT.
    """
    path = Path(adapter).expanduser()
    if not path.is_dir():
        if path.exists():
            raise ToolfidError(f"adapter {path} is a file; give the adapter folder (with adapter_config.json)")
        raise ToolfidError(f"adapter directory not found: {path}")
    cfg = path / "adapter_config.json"
    if not cfg.is_file():
        raise ToolfidError(f"{path} is not a PEFT adapter: no adapter_config.json")
    config = read_json_object(cfg, "adapter config")
    if "peft_type" not in config:
        raise ToolfidError(f"{cfg}: not a PEFT adapter config (no peft_type)")
    if (path / SAFETENSORS).is_file():
        shapes = safetensors_shapes(path / SAFETENSORS)
    elif (path / PICKLE_BIN).is_file():
        shapes = bin_shapes(path / PICKLE_BIN)
    else:
        raise ToolfidError(f"{path}: no adapter weights ({SAFETENSORS})")
    if not shapes:
        raise ToolfidError(f"{path / SAFETENSORS}: holds no tensors; re-save the adapter")
    if (path / SAFETENSORS).is_file():
        bad = first_non_finite(path / SAFETENSORS)
        if bad is not None:
            raise ToolfidError(f"adapter {path}: tensor {bad} holds NaN or infinite values (a diverged training "
                               "run?); such weights give no answer worth scoring and would poison other adapters' "
                               "rows of a batch: use a checkpoint before the divergence")
    if base is None:
        return
    base_dir = Path(base).expanduser()
    recorded = config.get("base_model_name_or_path")
    warn_other_base(path, recorded, str(base))
    if not base_dir.is_dir():
        return  # a hub id: nothing local to compare with cheaply
    base_shapes = base_weight_shapes(base_dir)
    if base_shapes is None:
        return
    problem = _fit_problem(shapes, config, base_shapes)
    if problem:
        raise ToolfidError(f"adapter {path} does not fit base {base_dir}: {problem} "
                           f"(adapter trained for {recorded or 'another model'}?)")


def base_names(base: str) -> set[str]:
    """The names a base goes by, folded for comparison: its last path component (a local folder, or a hub id's
    repository name) and, for a local folder, the ``_name_or_path`` its config.json records."""
    names = {Path(base.rstrip("/")).name}
    config = Path(base).expanduser() / "config.json"
    if config.is_file():
        with contextlib.suppress(OSError, ValueError, AttributeError):
            recorded = json.loads(config.read_text(encoding="utf-8")).get("_name_or_path")
            if isinstance(recorded, str) and recorded:
                names.add(Path(recorded.rstrip("/")).name)
    return {n.lower() for n in names if n}


def warn_other_base(adapter: Path, recorded: Any, base: str) -> bool:
    """One warning line when the adapter's ``base_model_name_or_path`` names another model than ``base`` (the run
    goes on: a local folder and a hub id name the same model differently); says what was compared."""
    if not isinstance(recorded, str) or not recorded.strip():
        return False
    theirs = Path(recorded.strip().rstrip("/")).name.lower()
    ours = base_names(base)
    if theirs in ours:
        return False
    log.warning("toolfid: adapter %s was made for base %r (adapter_config.json base_model_name_or_path), "
                "this run's base is %s: the names differ (compared %r with %s); evaluating it anyway", adapter,
                recorded, base, theirs, " / ".join(repr(n) for n in sorted(ours)))
    return True


# --- update norms and shape -----------------------------------------------------------------

NORM_RTOL = 0.10
"""Relative tolerance on the adapter's total update norm when a calibration is reused."""

_PAIR_TAGS = ((".lora_A.", ".lora_B."), (".lora_embedding_A", ".lora_embedding_B"))


def module_pairs(state: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """module prefix → (A key, B key) for LoRA and embedding-LoRA weights."""
    pairs: dict[str, tuple[str, str]] = {}
    for key in sorted(state):
        for a_tag, b_tag in _PAIR_TAGS:
            if a_tag in key:
                prefix = key.split(a_tag)[0]
                b_key = key.replace(a_tag, b_tag)
                if b_key not in state:
                    raise ToolfidError(f"adapter weights have {key} without its {b_tag.strip('.')} partner")
                pairs[prefix] = (key, b_key)
    if not pairs:
        raise ToolfidError("adapter has no LoRA A/B weight pairs (only LoRA adapters can be calibrated)")
    return pairs


def update_norm(a: Any, b: Any) -> float:
    """‖B·A‖_F computed through r×r matrices: tr((BᵀB)(AAᵀ))."""
    a64, b64 = a.double(), b.double()
    return float(((b64.T @ b64) * (a64 @ a64.T)).sum().clamp_min(0).sqrt())


def module_update_norms(state: dict[str, Any]) -> dict[str, float]:
    """module prefix → ‖B·A‖_F of the real adapter's LoRA update (scaling α/r left out: same shape, same α/r)."""
    return {prefix: update_norm(state[a], state[b]) for prefix, (a, b) in module_pairs(state).items()}


def adapter_update_norm(adapter_dir: str | Path) -> float:
    """The adapter's total LoRA update norm Σ_modules ‖B·A‖_F, read from adapter_model.safetensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights = Path(adapter_dir).expanduser() / "adapter_model.safetensors"
    if not weights.is_file():
        raise ToolfidError(f"{weights.parent}: no adapter_model.safetensors (its update norm is needed to use a calibration)")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ToolfidError(f"{weights}: unreadable safetensors file ({exc})") from None
    return sum(module_update_norms(state).values())


def norms_agree(a: float, b: float, rtol: float = NORM_RTOL) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-12)


def check_shared_calibration(adapters: Mapping[str, str]) -> None:
    """One calibration (``--null-runs``) serves every adapter of a run only if they share one shape and one update
    norm (label -> adapter folder)."""
    shapes = {adapter_shape(p)["hash"] for p in adapters.values()}
    if len(shapes) > 1:
        raise ToolfidError("--null-runs calibrates one adapter shape; these adapters differ in shape: "
                           "calibrate them in separate runs")
    norms = {name: adapter_update_norm(p) for name, p in adapters.items()}
    first_norm = next(iter(norms.values()))
    if not all(norms_agree(first_norm, v) for v in norms.values()):
        raise ToolfidError("--null-runs calibrates one adapter update norm; these adapters differ ("
                           + ", ".join(f"{k} {v:.3g}" for k, v in norms.items()) + "): run each with --null-runs")


# --- adapter shape -------------------------------------------------------------------------

_SHAPE_CONFIG_KEYS = ("peft_type", "r", "lora_alpha", "target_modules", "use_rslora", "use_dora",
                      "rank_pattern", "alpha_pattern", "modules_to_save", "fan_in_fan_out", "bias")


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
    shapes = safetensors_shapes(weights) if weights.is_file() else {}
    blob = json.dumps({"config": picked, "shapes": shapes}, sort_keys=True).encode()
    summary = f"r={picked.get('r')}, alpha={picked.get('lora_alpha')}, targets={picked.get('target_modules')}"
    return {"hash": hashlib.sha256(blob).hexdigest()[:16], "summary": summary, "config": picked}
