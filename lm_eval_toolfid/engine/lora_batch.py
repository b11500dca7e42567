"""Every adapter of a pass in one gathered LoRA computation per layer (Punica's BGMV / S-LoRA, in plain torch).

PEFT computes a mixed batch adapter by adapter: per LoRA layer and adapter, the rows picked by a Python list turned
into a tensor, two linears, a cast, a scaling and an in-place add, so every adapter added to a batch adds about a base
step's worth of calls. Here a model's LoRA adapters are gathered once per layer (:class:`LoraStack`, cached on the model
and rebuilt only when its adapters or their weights change), grouped by rank class (:func:`rank_class`: an adapter's
own rank rounded up to a power of two, at least 8): per class, ``A = [A_1ᵀ; …; A_Kᵀ; 0]`` (``slots × d_in × R``) and
``B = [s_1·B_1ᵀ; …; s_K·B_Kᵀ; 0]`` (``slots × R × d_out``, the scaling folded in), in float32. A pass names each row's adapter once, as an index on
the model's device (:class:`PassRows`: each row's slot in every class, its scaling, whether it has a delta), and
every LoRA layer computes, in a fixed number of calls whatever the number of adapters (a few per rank class present)::

    h = bmm(x, A[slot]);  out = where(row has a delta here, baddbmm(base(x), h, B[slot]), base(x))

Each row computes only its own adapter's blocks (FLOPs per row flat in the number of adapters; one wide adapter
widens only its own class), so a row's arithmetic does not depend on which or how many adapters share its pass, and
a NaN in one adapter reaches only its own rows. A pass the host names by its rows' adapters (a prompt, prefix or
verification pass: :attr:`PassRows.members`, :attr:`PassRows.known`) also skips what its rows do not need: a rank
class none of its rows is of, the rows of other classes (and base rows) in a class's products (gathered, computed,
put back: a row of an r = 8 adapter beside r = 64 ones pays r = 8), the LoRA of a layer where no row has a delta and
the ``where`` where every row has one. A decode step, which a CUDA graph replays for other rows, decides per row on
the device, every class for every row. The LoRA arithmetic runs in float32 and is added to the base layer's
output once, rounded once to the model's dtype: what PEFT does with its default ``autocast_adapter_dtype``. A base
row, and a row of an adapter whose A or B is all zero in that layer, gets the base layer's output exactly (a
``where``, never a multiply: ``0 * inf`` is NaN). The same computation serves every pass that computes adapter rows
(prompt, prefix, verification passes, decode steps, a joint batch or one adapter's view), so the modes agree with each
other; against PEFT's own forward it may differ in the last bit (the scaling folded into B, another summation order): the
engine counts such rows' near ties (``RowResult.lora_near_ties``).

What the stack cannot represent exactly (DoRA and other LoRA variants, a LoRA bias, embedding or convolution LoRA,
``fan_in_fan_out``, dropout in training mode, ``modules_to_save``, a layer whose forward is already wrapped) is left to
PEFT (:func:`stack_unsupported`; the engine says so once in the log)."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

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


RANK_FLOOR = 8
"""The narrowest rank class: adapters of rank ≤ 8 share one."""


def rank_class(rank: int) -> int:
    """The padded width an adapter of ``rank`` computes at: the next power of two, at least :data:`RANK_FLOOR`. An
    adapter's class is its own (its widest layer's), whatever else is loaded, so its rows' arithmetic never
    depends on the other adapters; an r = 256 adapter costs its own rows, not every row."""
    width = RANK_FLOOR
    while width < rank:
        width *= 2
    return width


@dataclass(frozen=True)
class RankGroup:
    """The adapters of one rank class in one LoRA layer, gathered per row: slot ``j`` is the class's ``j``-th
    adapter, the last slot zeros (a row of another class, or the base, reads it and its delta is never used)."""

    cls: int
    """Which class of :attr:`LoraStack.classes`."""
    A: Any
    """``[slots, d_in, R]`` float32: adapter j's ``Aᵀ`` in ``A[j, :, :r_j]``, zeros after."""
    B: Any
    """``[slots, R, d_out]`` float32: adapter j's ``scaling · Bᵀ`` in ``B[j, :r_j]``."""


@dataclass(frozen=True)
class StackedLayer:
    """One LoRA layer's adapters, gathered by rank class (only the classes with an adapter in this layer)."""

    groups: tuple[RankGroup, ...]
    pattern: int
    """Which adapters have a delta in this layer: a row of :attr:`LoraStack.live`."""


@dataclass(frozen=True)
class PassRows:
    """One pass's rows as the gathered layers read them (built once per pass, on the model's device)."""

    slots: tuple[Any, ...]
    """Per rank class, ``[rows]`` long: the row's slot in that class (the zero slot when not of it)."""
    live: tuple[Any, ...]
    """Per live pattern, ``[rows, 1, 1]`` bool: the row's adapter has a delta in that pattern's layers."""
    members: tuple[Any, ...] | None = None
    """Per rank class, what the host knows of the pass's rows (a pass named by its adapters' names): ``False`` no row
    of that class (its products skipped), ``True`` every row of it (computed for every row, as without names), or
    ``(rows, slots)``: only those rows (a ``[n]`` long index on the device, and their slots), gathered, computed and
    put back, so a row never pays for another class's width (a pass mixing r = 8 and r = 64 adapters, or adapter rows
    beside base rows). None: every class computed for every row (a decode step's device index)."""
    known: tuple[bool | None, ...] | None = None
    """Per live pattern, what the host knows of the pass's rows (a pass named by its adapters' names, never a
    decode step's device index, which a captured graph replays for other rows): ``True`` every row has a delta in
    that pattern's layers (the ``where`` would pick every row's sum: skipped), ``False`` none has (the layer is the
    base layer's output: nothing of the LoRA computed), ``None`` some have (the ``where`` picks per row)."""


class LoraStack:
    """The adapters of a model gathered per LoRA layer (see the module's docstring)."""

    def __init__(self, names: tuple[str, ...], widest: dict[str, int], classes: tuple[int, ...],
                 layers: dict[int, StackedLayer], slot_of: tuple[Any, ...], live: Any, key: tuple[Any, ...],
                 live_host: tuple[tuple[bool, ...], ...] = (), class_of: tuple[int | None, ...] = ()) -> None:
        self.names = names
        self.widest = widest
        """adapter name -> its widest layer's rank (its class: :func:`rank_class`)."""
        self.index = {name: k for k, name in enumerate(names)}
        """adapter name -> its index; a base row's index is ``len(names)`` (no adapter, no delta)."""
        self.classes = classes
        """The rank classes present (:func:`rank_class`), narrowest first."""
        self.layers = layers
        """``id(module)`` -> its gathered weights."""
        self.slot_of = slot_of
        """Per class, ``[K + 1]`` long on the device: adapter k's slot in that class (its zero slot if not of it)."""
        self.live = live
        """``[patterns, K + 1]`` bool on the device: adapter k has a delta in a layer of that pattern (the last
        column, the base, never)."""
        self.live_host = live_host
        """:attr:`live` on the host (read once, when the stack was built): which passes may skip the ``where`` or the
        whole LoRA computation of a layer (:meth:`rows` given the rows' indices on the host)."""
        self.class_of = class_of
        """Per adapter index (the base's last), which of :attr:`classes` it computes in (None: the base)."""
        self.class_dev = (slot_of[0].new_tensor([len(classes) if c is None else c for c in class_of])  # long
                          if class_of and slot_of else None)
        """:attr:`class_of` on the device (the base: one past the last class), ``[K + 1]`` long."""
        self.key = key

    @property
    def device(self) -> Any:
        return self.live.device

    def rows(self, index: Any, host: Sequence[int] | None = None) -> PassRows:
        """The gathers' indices of a pass whose row b runs adapter ``index[b]`` (a ``[rows]`` long tensor on the
        device, ``len(names)`` for the base): a few calls per pass and class, none per layer. ``host``: the same
        indices on the host (a pass named by its adapters' names), so each pattern's :attr:`PassRows.known` says
        whether every row, or no row, has a delta there."""
        slots = tuple(slot.index_select(0, index) for slot in self.slot_of)
        live = self.live.index_select(1, index)[:, :, None, None]
        known = members = None
        if host is not None and self.live_host:
            known = tuple(True if all(flags[i] for i in host) else (False if not any(flags[i] for i in host) else None)
                          for flags in self.live_host)
        if host is not None and self.class_dev is not None:
            import torch

            of = Counter(self.class_of[k] for k in host)
            counts = [of[c] for c in range(len(self.classes))]
            out: list[Any] = [bool(n) for n in counts]
            if any(0 < n < len(host) for n in counts):
                # the rows by class, on the device (a stable sort of their classes, the base's last): class c's rows
                # are the counts before it on, read with the host's counts (no tensor made from host values here)
                order = torch.argsort(self.class_dev.index_select(0, index), stable=True)
                start = 0
                for c, n in enumerate(counts):
                    if 0 < n < len(host):
                        at = order[start:start + n]
                        out[c] = (at, slots[c].index_select(0, at))
                    start += n
            members = tuple(out)
        return PassRows(slots=slots, live=tuple(live.unbind(0)), known=known, members=members)

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
    def build(cls, layers: Sequence[Any], names: tuple[str, ...], key: tuple[Any, ...],
              stored: dict[str, Any] | None = None, module_names: dict[int, str] | None = None) -> LoraStack:
        """The stack of ``names``: PEFT's adapters from each layer, ``stored`` ones
        (:class:`~lm_eval_toolfid.engine.adapter_store.StoredAdapter`) by the layer's module name."""
        import torch

        stored, module_names = stored or {}, module_names or {}

        def weights(m: Any, name: str) -> tuple[Any, Any, float] | None:  # (A [r, d_in], B [d_out, r], scaling)
            if name in m.lora_A:
                return m.lora_A[name].weight, m.lora_B[name].weight, float(m.scaling[name])
            adapter = stored.get(name)
            return adapter.modules.get(module_names.get(id(m), "")) if adapter is not None else None

        K = len(names)
        widest = {n: max([int(w[0].shape[0]) for m in layers if (w := weights(m, n)) is not None] or [1])
                  for n in names}
        of_class = {n: rank_class(widest[n]) for n in names}
        classes = tuple(sorted(set(of_class.values())))
        members = {c: [n for n in names if of_class[n] == c] for c in classes}
        device = layers[0].base_layer.weight.device
        f32 = torch.float32
        flags = []
        gathered: dict[int, list[tuple[int, Any, Any]]] = {}
        with torch.inference_mode(False), torch.no_grad():
            for m in layers:
                groups = []
                for c_i, c in enumerate(classes):
                    present = [(j, w) for j, n in enumerate(members[c]) if (w := weights(m, n)) is not None]
                    if not present:
                        continue
                    slots = len(members[c]) + 1
                    A = torch.zeros((slots, m.in_features, c), dtype=f32, device=device)
                    B = torch.zeros((slots, c, m.out_features), dtype=f32, device=device)
                    for j, (a, b, scaling) in present:
                        r = a.shape[0]
                        A[j, :, :r] = a.detach().t().to(device=device, dtype=f32)
                        B[j, :r] = b.detach().t().to(device=device, dtype=f32) * scaling
                    groups.append((c_i, A, B))
                gathered[id(m)] = groups
                for name in names:
                    w = weights(m, name)
                    flags.append(torch.zeros((), dtype=torch.bool, device=device) if w is None else
                                 w[0].ne(0).any().to(device) & w[1].ne(0).any().to(device))
            per_layer = torch.stack(flags).view(len(layers), K).tolist() if flags else []  # once per stack
            patterns: dict[tuple[bool, ...], int] = {}
            out = {}
            for m, flag in zip(layers, per_layer):
                pattern = patterns.setdefault(tuple(flag), len(patterns))
                out[id(m)] = StackedLayer(tuple(RankGroup(c_i, A, B) for c_i, A, B in gathered[id(m)]), pattern)
            live_host = tuple((*p, False) for p in patterns) or ((False,) * (K + 1),)
            live = torch.tensor([list(p) for p in live_host], dtype=torch.bool, device=device)
            slot_of = tuple(torch.tensor([members[c].index(n) if n in members[c] else len(members[c])
                                          for n in names] + [len(members[c])], dtype=torch.long, device=device)
                            for c in classes)
        class_of = tuple(classes.index(of_class[n]) for n in names) + (None,)
        return cls(names, widest, classes, out, slot_of, live, key, live_host, class_of)


def lora_stack(model: Any, layers: Sequence[Any]) -> LoraStack:
    """The model's stack (every LoRA adapter PEFT holds, in PEFT's order, then the adapters stored for the engine:
    :mod:`~lm_eval_toolfid.engine.adapter_store`), cached on the model and rebuilt when :meth:`LoraStack.key_of` or
    the stored adapters change. The caller checked :func:`stack_unsupported`."""
    from lm_eval_toolfid.engine.adapter_store import lora_modules, store_of

    names = tuple(dict.fromkeys(name for m in layers for name in m.lora_A))
    configs = getattr(model, "peft_config", None)
    if isinstance(configs, dict):  # PEFT's order (the first adapter loaded first)
        names = tuple(n for n in configs if n in names) + tuple(n for n in names if n not in configs)
    store = store_of(model)
    stored = dict(store.adapters) if store is not None else {}
    names += tuple(n for n in stored if n not in names)
    key = (names, LoraStack.key_of(layers), tuple((n, id(a)) for n, a in stored.items()))
    held = getattr(model, _STACK_ATTR, None)
    if held is not None and held.key == key:
        return held
    module_names = {id(m): name for name, m in lora_modules(model).items()} if stored else {}
    stack = LoraStack.build(layers, names, key, stored, module_names)
    object.__setattr__(model, _STACK_ATTR, stack)  # a plain attribute, not a submodule or buffer
    return stack


class BatchedLora:
    """While installed (:meth:`installed`), each LoRA layer of the model runs :meth:`_layer_forward` instead of PEFT's
    forward; :meth:`select` names the rows of the next pass. ``views``: the adapters the run's rows may name (None:
    every adapter of the stack): only their rank classes are computed, so an adapter loaded but not in the run costs
    nothing, and a row pays for the classes of the run's adapters, never for a wider one merely loaded."""

    def __init__(self, stack: LoraStack, layers: Sequence[Any], views: Iterable[str | None] | None = None) -> None:
        import torch

        self.torch = torch
        self.stack = stack
        self.layers = list(layers)
        self.current: PassRows | None = None
        self._passes: dict[tuple[Any, ...], PassRows] = {}
        named = set(stack.names) if views is None else {v for v in views if v is not None}
        self.allowed = named
        """The adapters this run's rows may name (a row of another would get no delta: refused)."""
        widths = {rank_class(stack.widest[n]) for n in named if n in stack.widest}
        self.computed = frozenset(i for i, c in enumerate(stack.classes) if c in widths)
        """Which rank classes the layers compute (those of :attr:`allowed`)."""

    def index(self, views: Sequence[str | None], at: Sequence[int] | None = None) -> Any:
        """The rows' adapter index on the device (one host-to-device copy; ``at``: the same on the host, if known)."""
        at = self._host_index(views) if at is None else at
        return self.torch.tensor(at, dtype=self.torch.long).to(self.stack.device)

    def _host_index(self, views: Sequence[str | None]) -> list[int]:
        outside = {v for v in views if v is not None} - self.allowed
        if outside:
            raise ValueError(f"rows of adapter(s) {', '.join(sorted(outside))} in a run of {sorted(self.allowed)}")
        base = len(self.stack.names)
        return [base if v is None else self.stack.index[v] for v in views]

    def select(self, views: Sequence[str | None] | Any, host: Sequence[str | None] | None = None) -> None:
        """The rows of the next pass: their adapter names (None: the base), or their index on the device. Names are
        turned into masks once per distinct batch (a decode batch whose rows do not change builds nothing).
        ``host``: with a device index, the same rows' names, for a pass no graph captures (a prompt or verification
        pass): each layer then skips what the host knows it need not compute (:attr:`PassRows.known`)."""
        if not isinstance(views, (list, tuple)):
            self.current = self.stack.rows(views, None if host is None else self._host_index(host))
            return
        key = tuple(views)
        rows = self._passes.get(key)
        if rows is None:
            if len(self._passes) >= 256:
                self._passes.clear()
            at = self._host_index(views)
            rows = self._passes[key] = self.stack.rows(self.index(views, at), at)
        self.current = rows

    @contextlib.contextmanager
    def installed(self) -> Iterator[BatchedLora]:
        for m in self.layers:
            layer = self.stack.layers[id(m)]
            groups = tuple(g for g in layer.groups if g.cls in self.computed)
            m.forward = functools.partial(self._layer_forward, m, StackedLayer(groups, layer.pattern))
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
        known = rows.known[layer.pattern] if rows.known is not None else None
        if not layer.groups or known is False:  # no row of the pass has a delta here: the base layer's output
            return base
        if x.dim() != 3:
            raise RuntimeError(f"a stacked LoRA layer takes [rows, positions, features], not {tuple(x.shape)}")
        if x.dtype != torch.float32:  # LoRA arithmetic in float32, rounded once (PEFT's autocast_adapter_dtype)
            x, out = x.to(torch.float32), base.to(torch.float32)
        else:
            out = base
        for group in layer.groups:  # per rank class present: each row's own A and B, gathered
            member = rows.members[group.cls] if rows.members is not None else True
            if member is False:  # no row of this class in the pass
                continue
            if member is not True:  # only this class's rows: gathered, computed, put back
                at, slot = member
                h = torch.bmm(x.index_select(0, at), group.A.index_select(0, slot))
                out = out.index_copy(0, at, torch.baddbmm(out.index_select(0, at), h, group.B.index_select(0, slot)))
                continue
            slot = rows.slots[group.cls]
            if slot.shape[0] != x.shape[0]:  # one adapter's view: one index for every row
                slot = slot.expand(x.shape[0])
            h = torch.bmm(x, group.A.index_select(0, slot))
            out = torch.baddbmm(out, h, group.B.index_select(0, slot))  # base + h·(s·Bᵀ), one call
        if out.dtype != base.dtype:
            out = out.to(base.dtype)
        if known:  # every row has a delta here: the where would pick each row's sum
            return out
        return torch.where(rows.live[layer.pattern], out, base)
