"""LoRA adapters read straight from their PEFT folders into the engine (:class:`AdapterStore`), not injected one by
one into the ``PeftModel``.

PEFT's ``load_adapter`` walks every module of the model for each adapter it adds, and the walk grows with the
adapters already loaded (each LoRA layer holds a module per adapter): a hundred adapters took 12 s on the bundled
fixture model, most of it in ``named_modules``. The engine needs no module per adapter: the gathered LoRA computation
(:mod:`~lm_eval_toolfid.engine.lora_batch`) reads each adapter's ``A``, ``B`` and scaling per LoRA layer. So an adapter
the store can represent exactly is read from its ``adapter_model.safetensors`` (each module's ``lora_A``/``lora_B``,
the scaling PEFT would give it: ``lora_alpha / r``, rsLoRA's ``lora_alpha / sqrt(r)``, ``rank_pattern`` and
``alpha_pattern`` resolved by PEFT's own ``get_pattern_key``), on the LoRA layers the model already has (those of the
adapter PEFT loaded first). Identical files are read once. What the store cannot represent (another PEFT type, DoRA,
a LoRA bias, ``modules_to_save``, trainable tokens, a module the first adapter does not wrap…) goes through PEFT, as
before (:func:`store_unsupported` says why).

A stored adapter exists only for the engine's stacked computation. Anything else that would run it — PEFT's own
forward (``generate``, a mixed batch) — first has it loaded into PEFT (:meth:`AdapterStore.materialize`), so no path
ever computes a stored adapter's rows under another adapter's weights."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

log = logging.getLogger("lm_eval.toolfid")

_STORE_ATTR = "_toolfid_adapter_store"
_A, _B = ".lora_A.weight", ".lora_B.weight"
_RISKY = {"use_dora": False, "lora_bias": False, "fan_in_fan_out": False, "modules_to_save": None,
          "trainable_token_indices": None, "layer_replication": None, "target_parameters": None,
          "alora_invocation_tokens": None, "arrow_config": None, "use_qalora": False, "megatron_config": None}
"""Config fields whose non-default values change what the adapter computes beyond ``scaling · B · A`` on a linear."""


@dataclass(frozen=True)
class StoredAdapter:
    """One adapter as the engine reads it: per module of the model, ``A`` ``[r, d_in]``, ``B`` ``[d_out, r]`` and the
    scaling PEFT would give that module."""

    name: str
    path: str
    modules: dict[str, tuple[Any, Any, float]]
    """Module name in the ``PeftModel`` (``base_model.model.…q_proj``) -> (A, B, scaling)."""


@dataclass
class AdapterStore:
    """The adapters of a ``PeftModel`` that the engine computes and PEFT does not hold (attached to the model:
    :func:`store_of`)."""

    adapters: dict[str, StoredAdapter] = field(default_factory=dict)
    active: str | None = None
    """The stored adapter a view of one adapter runs (``ModelSession.activate``); None: PEFT's active adapter."""
    _read: dict[str, dict[str, tuple[Any, Any, float]]] = field(default_factory=dict)
    """File digest -> its modules (identical files read once)."""

    def add(self, name: str, path: str, model: Any) -> StoredAdapter:
        """Read the adapter at ``path`` under ``name`` (the caller checked :func:`store_unsupported`)."""
        weights = Path(path).expanduser() / "adapter_model.safetensors"
        digest = _digest(weights)
        modules = self._read.get(digest)
        if modules is None:
            modules = self._read[digest] = _read_modules(Path(path).expanduser(), model)
        adapter = self.adapters[name] = StoredAdapter(name, str(path), modules)
        return adapter

    def materialize(self, model: Any, names: Iterable[str]) -> None:
        """Load stored adapters into PEFT (for a path that runs PEFT's own forward), said once per adapter."""
        import torch

        for name in [n for n in names if n in self.adapters]:
            adapter = self.adapters.pop(name)
            log.warning("toolfid: adapter %r loaded into PEFT (its rows are computed by PEFT's forward)", name)
            with torch.inference_mode(False):
                model.load_adapter(adapter.path, adapter_name=name)
            if self.active == name:
                model.set_adapter(name)
                self.active = None


def store_of(model: Any, create: bool = False) -> AdapterStore | None:
    """The store attached to ``model`` (None: none; ``create``: attach an empty one)."""
    store = getattr(model, _STORE_ATTR, None)
    if store is None and create:
        store = AdapterStore()
        object.__setattr__(model, _STORE_ATTR, store)  # a plain attribute, not a submodule
    return store


def stored_names(model: Any) -> tuple[str, ...]:
    """The names of the adapters stored for ``model`` (in the order they were added)."""
    store = store_of(model)
    return tuple(store.adapters) if store is not None else ()


def _digest(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def lora_modules(model: Any) -> dict[str, Any]:
    """The model's PEFT linear LoRA layers by module name (the hooks the gathered computation runs in)."""
    try:
        from peft.tuners.lora.layer import Linear
    except ImportError:
        return {}
    return {name: m for name, m in model.named_modules() if type(m) is Linear}


def store_unsupported(path: str, model: Any, layers: dict[str, Any] | None = None) -> str | None:
    """Why the adapter at ``path`` cannot be read into the store for ``model`` (None: it can): a LoRA whose every
    tensor is a linear ``lora_A``/``lora_B`` of a module the model already wraps as a LoRA layer, in shapes that
    fit, with no setting that changes the computation beyond ``scaling · B · A``."""
    from safetensors import safe_open

    folder = Path(path).expanduser()
    try:
        config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "its adapter_config.json does not read"
    if not isinstance(config, dict) or str(config.get("peft_type", "")).upper() != "LORA":
        return f"it is {config.get('peft_type') if isinstance(config, dict) else 'not a PEFT adapter'}, not a LoRA"
    for key, default in _RISKY.items():
        if config.get(key, default) not in (default, [], {}, None, False):
            return f"it sets {key}"
    if config.get("bias", "none") != "none":
        return f"it trains biases (bias={config.get('bias')!r})"
    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        return "it has no adapter_model.safetensors"
    layers = lora_modules(model) if layers is None else layers
    try:
        with safe_open(str(weights), framework="pt") as fh:
            keys = list(fh.keys())
            shapes = {k: tuple(fh.get_slice(k).get_shape()) for k in keys}
    except Exception as exc:  # noqa: BLE001 - the check that reads weights says what is wrong, in one line
        return f"its weights do not read ({type(exc).__name__})"
    for key in keys:
        if not key.endswith((_A, _B)):
            return f"it holds {key}, not a linear LoRA weight"
        module = layers.get(key[:-len(_A)])
        if module is None:
            return f"{key[:-len(_A)]} is not a LoRA layer of the loaded model"
        shape = shapes[key]
        want = 1 if key.endswith(_A) else 0
        if len(shape) != 2 or shape[want] != (module.in_features if want else module.out_features):
            return f"{key} has shape {shape}"
    for key in keys:
        partner = key[:-len(_A)] + (_B if key.endswith(_A) else _A)
        if partner not in shapes:
            return f"{key} has no {partner.rsplit('.', 2)[-2]}"
    return None


def _read_modules(folder: Path, model: Any) -> dict[str, tuple[Any, Any, float]]:
    """Each module's (A, B, scaling) as PEFT would load them."""
    from peft.utils.other import get_pattern_key
    from safetensors.torch import load_file

    config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    rank_pattern, alpha_pattern = config.get("rank_pattern") or {}, config.get("alpha_pattern") or {}
    out = {}
    for key, a in tensors.items():
        if not key.endswith(_A):
            continue
        module = key[:-len(_A)]
        inner = module.removeprefix("base_model.model.")  # the name PEFT's patterns are matched against
        r = int(config.get("r", 8))
        if rank_pattern:
            found = get_pattern_key(list(rank_pattern), inner)
            r = int(rank_pattern.get(found, r))
        alpha = config.get("lora_alpha", 8)
        if alpha_pattern:
            found = get_pattern_key(list(alpha_pattern), inner)
            alpha = alpha_pattern.get(found, alpha)
        scaling = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
        out[module] = (a, tensors[module + _B], float(scaling))
    return out
