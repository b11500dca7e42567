"""The slot-KV store: every allocation, copy and release of the engine's per-layer KV buffers.

A row's KV after a pass is named by a :class:`KVRef` (per-layer key/value buffers, the row's slot in them, and the
``(first column, length)`` spans of its KV, in order). :class:`KVStore` allocates buffers shaped like others
(:meth:`~KVStore.alloc`), copies a row's spans into a slot (:meth:`~KVStore.place`), makes them contiguous for the
prefix store (:meth:`~KVStore.gather`), keeps a subset of rows (:meth:`~KVStore.select`), and wraps buffers as the
cache a forward pass writes into (:meth:`~KVStore.cache`). :class:`DecodeSlots` holds the decode batch's buffers:
rows join right-aligned at column ``T`` (reallocated only when they do not fit), a finished row's slot is taken by
the last live row, and columns no live row uses are dropped once they are a quarter of the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from lm_eval_toolfid.engine.slot_cache import slot_cache_classes

LayerKV = Sequence[tuple[Any, Any]]
"""Per layer: a keys and a values buffer, ``[rows, heads, columns, dim]``."""


@dataclass(frozen=True)
class KVRef:
    """One row's KV: slot ``slot`` of the per-layer buffers ``kv``, in ``spans`` (``(first column, length)``
    pieces, in order)."""

    kv: LayerKV
    slot: int
    spans: tuple[tuple[int, int], ...]

    @staticmethod
    def of_layers(layers: Sequence[Any], slot: int, spans: Sequence[tuple[int, int]]) -> KVRef:
        """A row of a forward pass's cache layers."""
        return KVRef(tuple((layer.kbuf, layer.vbuf) for layer in layers), slot, tuple(spans))


class KVStore:
    """Allocation, copying and selection of per-layer KV buffers for one model."""

    def __init__(self, torch: Any, device: Any, n_layers: int) -> None:
        self.torch = torch
        self.device = device
        self.n_layers = n_layers
        self.SlotLayer, self.SlotCache = slot_cache_classes()

    def alloc(self, like: LayerKV, slots: int, columns: int) -> list[tuple[Any, Any]]:
        """Zeroed per-layer buffers of ``slots`` rows and ``columns`` columns, heads, dim and dtype as ``like``'s."""
        return [(k.new_zeros(slots, k.shape[1], columns, k.shape[3]), v.new_zeros(slots, v.shape[1], columns, v.shape[3]))
                for k, v in like]

    @staticmethod
    def place(kv: LayerKV, slot: int, first: int, src: KVRef) -> None:
        """``src``'s spans into slot ``slot`` of ``kv``, one after another from column ``first``."""
        for (k, v), (sk, sv) in zip(kv, src.kv):
            col = first
            for a, n in src.spans:
                k[slot, :, col:col + n] = sk[src.slot, :, a:a + n]
                v[slot, :, col:col + n] = sv[src.slot, :, a:a + n]
                col += n

    def gather(self, src: KVRef) -> list[tuple[Any, Any]]:
        """``src``'s KV as one contiguous ``[1, heads, length, dim]`` pair per layer (a copy)."""
        def one(buf: Any) -> Any:
            parts = [buf[src.slot:src.slot + 1, :, a:a + n] for a, n in src.spans]
            return parts[0].clone() if len(parts) == 1 else self.torch.cat(parts, dim=2)

        return [(one(k), one(v)) for k, v in src.kv]

    def select(self, layers: list[Any], sel: list[int]) -> list[Any]:
        """Cache layers holding only rows ``sel`` of ``layers`` (copied)."""
        dsel = self.torch.tensor(sel, dtype=self.torch.long, device=self.device)
        return [self.SlotLayer(layer.capacity, layer.kbuf.index_select(0, dsel), layer.vbuf.index_select(0, dsel),
                               length=layer.length) for layer in layers]

    def layers(self, kv: LayerKV, length: int) -> list[Any]:
        """Cache layers over buffers ``kv`` (capacity: their width), ``length`` columns valid."""
        return [self.SlotLayer(k.shape[2], k, v, length=length) for k, v in kv]

    def cache(self, layers: list[Any]) -> Any:
        """The transformers cache a forward pass appends to (in place, up to the layers' capacity)."""
        return self.SlotCache(layers)

    def empty_cache(self, capacity: int) -> Any:
        """A cache with no columns yet; its buffers are allocated by the first forward pass."""
        return self.SlotCache([self.SlotLayer(capacity) for _ in range(self.n_layers)])


class DecodeSlots:
    """The decode batch's KV: per-layer ``[slots, heads, capacity, dim]`` buffers and a ``[slots, capacity]`` mask,
    live rows in slots ``0..n-1``, every one ending at column ``T`` (left padding)."""

    def __init__(self, store: KVStore, max_batch: int, spare_columns: bool) -> None:
        self.store = store
        self.max_batch = max_batch
        self.spare_columns = spare_columns
        """Allocate a quarter of ``T`` more columns than needed (CPU): rows that join later fit without moving."""
        self.kv: list[tuple[Any, Any]] = []
        self.mask: Any = None
        self.T = 0
        self.cap = 0

    def join(self, n: int, joins: Sequence[tuple[int, KVRef]], need: int, waiting: int) -> None:
        """Rows ``(length, KV)`` into slots ``n..`` (``n`` live rows before them), right-aligned at the new ``T``.

        The buffers are reused while the rows fit: enough free slots, and room for ``need`` more columns (each
        row's remaining budget). Otherwise (or when a joining row is longer than ``T``) they are allocated again,
        with room for ``waiting`` rows more up to ``max_batch``, the live rows copied in: once per admission at
        most, never per step."""
        torch = self.store.torch
        m = len(joins)
        T = max([self.T, *(length for length, _ in joins)])
        fits = bool(self.kv) and n + m <= self.kv[0][0].shape[0] and T + need <= self.cap
        if fits and T > self.T and n:  # a longer row joins: the live rows move right, in place
            shift = T - self.T
            for k, v in self.kv:
                k[:n, :, shift:T] = k[:n, :, :self.T].clone()
                v[:n, :, shift:T] = v[:n, :, :self.T].clone()
            self.mask[:n, shift:T] = self.mask[:n, :self.T].clone()
            self.mask[:n, :shift] = 0
        elif not fits:
            slots = max(n + m, min(self.max_batch, n + m + waiting))
            # CPU: room for rows that join later without moving the others (auto caps the batch at 64 rows, memory
            # is plentiful); CUDA: exactly what auto's memory estimate counted (the whole view is usually one batch)
            cap = T + need + (T // 4 if self.spare_columns else 0)
            kv = self.store.alloc(joins[0][1].kv, slots, cap)
            mask = torch.zeros((slots, cap), dtype=torch.long)
            if n:
                for (k, v), (ok, ov) in zip(kv, self.kv):
                    k[:n, :, T - self.T:T] = ok[:n, :, :self.T]
                    v[:n, :, T - self.T:T] = ov[:n, :, :self.T]
                mask[:n, T - self.T:T] = self.mask[:n, :self.T]
            self.kv, self.mask, self.cap = kv, mask, cap
        for j, (length, src) in enumerate(joins):
            self.store.place(self.kv, n + j, T - length, src)
            self.mask[n + j] = 0
            self.mask[n + j, T - length:T] = 1
        self.T = T

    def open_step(self, n: int) -> tuple[Any, Any]:
        """The cache and mask of one decode step of the ``n`` live rows (views of the buffers, no copy): the
        step's token takes column ``T`` (``T`` moves past it)."""
        T = self.T
        self.mask[:n, T] = 1
        cache = self.store.cache([self.store.SlotLayer(self.cap, k[:n], v[:n], length=T) for k, v in self.kv])
        self.T = T + 1
        return cache, self.mask[:n, :T + 1]

    def move(self, src: int, dst: int, length: int) -> None:
        """Slot ``src``'s last ``length`` columns (up to ``T``) and mask into slot ``dst`` (a finished row's slot
        taken)."""
        T = self.T
        first = T - length
        for k, v in self.kv:
            k[dst, :, first:T] = k[src, :, first:T]
            v[dst, :, first:T] = v[src, :, first:T]
        self.mask[dst] = self.mask[src]

    def trim(self, n: int, longest: int) -> None:
        """``n`` live rows, the longest ``longest`` columns: drop the columns before them once they are a quarter
        of ``T`` (and more than 64); none left: start over at column 0."""
        if not n:
            self.T = 0
            return
        T = self.T
        first = T - longest
        if first > max(64, T // 4):
            for k, v in self.kv:
                k[:n, :, :T - first] = k[:n, :, first:T].clone()
                v[:n, :, :T - first] = v[:n, :, first:T].clone()
            self.mask[:n, :T - first] = self.mask[:n, first:T].clone()
            self.mask[:n, T - first:] = 0
            self.T = T - first
