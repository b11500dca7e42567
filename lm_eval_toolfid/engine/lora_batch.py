"""Every adapter of a pass in one LoRA computation per layer (the Punica / S-LoRA idea, in plain torch).

PEFT computes a mixed batch adapter by adapter: per LoRA layer and adapter, the rows picked by a Python list turned
into a tensor, two linears, a cast, a scaling and an in-place add, so every adapter added to a batch adds about a base
step's worth of calls. Here a model's LoRA adapters are stacked once per layer (:class:`LoraStack`, cached on the model
and rebuilt only when its adapters or their weights change): ``A_all = [A_1ᵀ | … | A_Kᵀ]`` (``d_in × K·R``, each block
padded to the widest rank ``R``) and ``B_all = [s_1·B_1ᵀ; …; s_K·B_Kᵀ]`` (``K·R × d_out``, the scaling folded in), in the
model's dtype. A pass names each row's adapter once, as an index on the model's device (:class:`PassRows`: which block
each row keeps, which rows have a delta), and every LoRA layer computes, in a fixed number of calls whatever the number
of adapters::

    h = x @ A_all;  h[blocks not the row's] = 0;  out = where(row has a delta here, base(x) + h @ B_all, base(x))

A base row, and a row of an adapter whose A or B is all zero in that layer, gets the base layer's output exactly (a
``where``, never a multiply: ``0 * inf`` is NaN). The same computation serves every pass that computes adapter rows
(prompt, prefix, verification passes, decode steps, a joint batch or one adapter's view), so the modes agree with each
other; against PEFT's own forward it may differ in the last bit (a non-power-of-two scaling, another summation
order): the engine counts such rows' near ties (``RowResult.lora_near_ties``).

What the stack cannot represent exactly (DoRA and other LoRA variants, a LoRA bias, embedding or convolution LoRA,
``fan_in_fan_out``, dropout in training mode, ``modules_to_save``, a layer whose forward is already wrapped) is left to
PEFT (:func:`stack_unsupported`; the engine says so once in the log)."""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

log = logging.getLogger("lm_eval.toolfid")

_STACK_ATTR = "_toolfid_lora_stack"
_said: set[str] = set()


def say_once(message: str) -> None:
    """A warning logged once per process (a fallback is said once, not per run)."""
    if message not in _said:
        _said.add(message)
        log.warning("toolfid: %s", message)


def lora_layers(model: Any) -> list[Any]:
    """PEFT's LoRA layers of ``model`` (none without PEFT)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return []
    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def stack_unsupported(model: Any, layers: Sequence[Any]) -> str | None:
    """Why ``model``'s adapters cannot be stacked exactly (None: they can)."""
    import torch

    try:
        from peft.tuners.lora.layer import Linear
        from peft.utils import AuxiliaryTrainingWrapper
    except ImportError:
        return "PEFT is not installed"
    if not layers:
        return "the model has no LoRA layers"
    for name, config in (getattr(model, "peft_config", None) or {}).items():
        kind = str(getattr(config, "peft_type", "")).rsplit(".", 1)[-1]
        if kind != "LORA":
            return f"adapter {name!r} is {kind or 'not a LoRA'}"
    if any(isinstance(m, AuxiliaryTrainingWrapper) for m in model.modules()):
        return "an adapter has modules_to_save or trainable tokens"
    devices = set()
    for m in layers:
        if type(m) is not Linear or type(m.base_layer) is not torch.nn.Linear:
            return f"{type(m).__name__} LoRA layers on {type(m.base_layer).__name__} (only linear ones are stacked)"
        if m.merged:
            return "an adapter is merged into the weights"
        if m.fan_in_fan_out:
            return "a LoRA layer has fan_in_fan_out"
        if "forward" in vars(m):
            return "a LoRA layer's forward is wrapped (accelerate hooks?)"
        for name in m.lora_A:
            if name in getattr(m, "lora_variant", {}):
                return f"adapter {name!r} is a LoRA variant ({type(m.lora_variant[name]).__name__})"
            if m.lora_B[name].bias is not None:
                return f"adapter {name!r} has a LoRA bias"
            drop = m.lora_dropout[name]
            if m.training and isinstance(drop, torch.nn.Dropout) and drop.p > 0:
                return f"adapter {name!r} has dropout and the model is in training mode"
        devices.add(m.base_layer.weight.device)
    if len(devices) > 1:
        return "the LoRA layers are on several devices"
    return None


@dataclass(frozen=True)
class StackedLayer:
    """One LoRA layer's adapters, stacked."""

    A: Any
    """``[d_in, K·R]``: adapter k's ``Aᵀ`` in columns ``k·R .. k·R + r_k`` (zeros after)."""
    B: Any
    """``[K·R, d_out]``: adapter k's ``scaling · Bᵀ`` in rows ``k·R .. k·R + r_k``."""
    pattern: int
    """Which adapters have a delta in this layer: a row of :attr:`LoraStack.live`."""


@dataclass(frozen=True)
class PassRows:
    """One pass's rows as the stacked layers read them (built once per pass, on the model's device)."""

    drop: Any
    """``[rows, 1, K·R]`` bool: the columns of ``h`` that are not the row's own adapter's block."""
    live: tuple[Any, ...]
    """Per live pattern, ``[rows, 1, 1]`` bool: the row's adapter has a delta in that pattern's layers."""


class LoraStack:
    """The adapters of a model stacked per LoRA layer (see the module's docstring)."""

    def __init__(self, names: tuple[str, ...], rank: int, layers: dict[int, StackedLayer], live: Any, owner: Any,
                 key: tuple[Any, ...]) -> None:
        self.names = names
        self.index = {name: k for k, name in enumerate(names)}
        """adapter name -> its block; a base row's index is ``len(names)`` (no block, no delta)."""
        self.rank = rank
        self.layers = layers
        """``id(module)`` -> its stacked weights."""
        self.live = live
        """``[patterns, K + 1]`` bool on the device: adapter k has a delta in a layer of that pattern (the last
        column, the base, never)."""
        self.owner = owner
        """``[K·R]`` long on the device: the adapter each column of ``h`` belongs to."""
        self.key = key

    @property
    def device(self) -> Any:
        return self.owner.device

    def rows(self, index: Any) -> PassRows:
        """The masks of a pass whose row b runs adapter ``index[b]`` (a ``[rows]`` long tensor on the device,
        ``len(names)`` for the base): four calls per pass, none per layer."""
        drop = (self.owner[None, :] != index[:, None]).unsqueeze(1)
        live = self.live.index_select(1, index)[:, :, None, None]
        return PassRows(drop=drop, live=tuple(live.unbind(0)))

    @staticmethod
    def key_of(layers: Sequence[Any]) -> tuple[Any, ...]:
        """What the stack depends on: every layer, its adapters, their weights (object, storage, in-place version:
        a weight swapped in place, as a null calibration does, changes it) and scalings."""
        out = []
        for m in layers:
            w = m.base_layer.weight
            parts: list[Any] = [id(m), w.dtype, w.device]
            for name in m.lora_A:
                a, b = m.lora_A[name].weight, m.lora_B[name].weight
                parts.append((name, id(a), a.data_ptr(), a._version, id(b), b.data_ptr(), b._version,
                              m.scaling[name]))
            out.append(tuple(parts))
        return tuple(out)

    @classmethod
    def build(cls, layers: Sequence[Any], names: tuple[str, ...], key: tuple[Any, ...]) -> LoraStack:
        import torch

        K = len(names)
        R = max([int(m.lora_A[n].weight.shape[0]) for m in layers for n in names if n in m.lora_A] or [1])
        device = layers[0].base_layer.weight.device
        stacked: dict[int, tuple[Any, Any]] = {}
        flags = []
        with torch.inference_mode(False), torch.no_grad():
            for m in layers:
                w = m.base_layer.weight
                A = torch.zeros((m.in_features, K * R), dtype=w.dtype, device=device)
                B = torch.zeros((K * R, m.out_features), dtype=w.dtype, device=device)
                for k, name in enumerate(names):
                    if name not in m.lora_A:
                        flags.append(torch.zeros((), dtype=torch.bool, device=device))
                        continue
                    a, b = m.lora_A[name].weight, m.lora_B[name].weight  # [r, d_in], [d_out, r]
                    r = a.shape[0]
                    A[:, k * R:k * R + r] = a.t().to(w.dtype)
                    B[k * R:k * R + r] = (b.t() * m.scaling[name]).to(w.dtype)
                    flags.append(A[:, k * R:k * R + r].ne(0).any() & B[k * R:k * R + r].ne(0).any())
                stacked[id(m)] = (A, B)
            per_layer = torch.stack(flags).view(len(layers), K).tolist() if flags else []  # once per stack
            patterns: dict[tuple[bool, ...], int] = {}
            out = {}
            for m, flag in zip(layers, per_layer):
                pattern = patterns.setdefault(tuple(flag), len(patterns))
                A, B = stacked[id(m)]
                out[id(m)] = StackedLayer(A, B, pattern)
            live = torch.tensor([[*p, False] for p in patterns] or [[False] * (K + 1)], dtype=torch.bool,
                                device=device)
            owner = torch.arange(K * R, device=device) // R
        return cls(names, R, out, live, owner, key)


def lora_stack(model: Any, layers: Sequence[Any]) -> LoraStack:
    """The model's stack (every LoRA adapter of the model, in the order PEFT holds them), cached on the model and
    rebuilt when :meth:`LoraStack.key_of` changes. The caller checked :func:`stack_unsupported`."""
    names = tuple(dict.fromkeys(name for m in layers for name in m.lora_A))
    configs = getattr(model, "peft_config", None)
    if isinstance(configs, dict):  # PEFT's order (the first adapter loaded first)
        names = tuple(n for n in configs if n in names) + tuple(n for n in names if n not in configs)
    key = (names, LoraStack.key_of(layers))
    held = getattr(model, _STACK_ATTR, None)
    if held is not None and held.key == key:
        return held
    stack = LoraStack.build(layers, names, key)
    object.__setattr__(model, _STACK_ATTR, stack)  # a plain attribute, not a submodule or buffer
    return stack


class BatchedLora:
    """While installed (:meth:`installed`), each LoRA layer of the model runs :meth:`_layer_forward` instead of PEFT's
    forward; :meth:`select` names the rows of the next pass."""

    def __init__(self, stack: LoraStack, layers: Sequence[Any]) -> None:
        import torch

        self.torch = torch
        self.stack = stack
        self.layers = list(layers)
        self.current: PassRows | None = None
        self._passes: dict[tuple[Any, ...], PassRows] = {}

    def index(self, views: Sequence[str | None]) -> Any:
        """The rows' adapter index on the device (one host-to-device copy)."""
        base = len(self.stack.names)
        return self.torch.tensor([base if v is None else self.stack.index[v] for v in views],
                                 dtype=self.torch.long).to(self.stack.device)

    def select(self, views: Sequence[str | None] | Any) -> None:
        """The rows of the next pass: their adapter names (None: the base), or their index on the device. Names are
        turned into masks once per distinct batch (a decode batch whose rows do not change builds nothing)."""
        if not isinstance(views, (list, tuple)):
            self.current = self.stack.rows(views)
            return
        key = tuple(views)
        rows = self._passes.get(key)
        if rows is None:
            if len(self._passes) >= 256:
                self._passes.clear()
            rows = self._passes[key] = self.stack.rows(self.index(views))
        self.current = rows

    @contextlib.contextmanager
    def installed(self) -> Iterator[BatchedLora]:
        for m in self.layers:
            m.forward = functools.partial(self._layer_forward, m, self.stack.layers[id(m)])
        try:
            yield self
        finally:
            for m in self.layers:
                vars(m).pop("forward", None)
            self.current, self._passes = None, {}

    def _layer_forward(self, module: Any, layer: StackedLayer, x: Any, *args: Any, **kwargs: Any) -> Any:
        torch, rows = self.torch, self.current
        if rows is None:
            raise RuntimeError("a stacked LoRA layer ran outside a pass that named its rows")
        kwargs.pop("adapter_names", None)
        base = module.base_layer(x, *args, **kwargs)
        if x.dtype != layer.A.dtype and not torch.is_autocast_enabled(x.device.type):
            x = x.to(layer.A.dtype)
        h = torch.matmul(x, layer.A).masked_fill_(rows.drop, 0)
        delta = torch.matmul(h, layer.B)
        if delta.dtype != base.dtype:
            delta = delta.to(base.dtype)
        return torch.where(rows.live[layer.pattern], base + delta, base)
