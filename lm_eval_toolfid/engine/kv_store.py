"""The slot-KV store: every allocation, copy and release of the engine's per-layer KV buffers.

A row's KV after a pass is named by a :class:`KVRef` (per-layer key/value buffers, the row's slot in them, and the
``(first column, length)`` spans of its KV, in order). :class:`KVStore` allocates buffers shaped like others
(:meth:`~KVStore.alloc`), copies a row's spans into a slot (:meth:`~KVStore.place`), makes them contiguous for the
prefix store (:meth:`~KVStore.gather`), keeps a subset of rows (:meth:`~KVStore.select`), and wraps buffers as the
cache a forward pass writes into (:meth:`~KVStore.cache`). :class:`DecodeSlots` holds the decode batch's buffers:
rows join right-aligned at column ``T`` (reallocated only when they do not fit), a finished row's slot is taken by
the last live row, and columns no live row uses are dropped (no longer read; nothing copied) once they are a quarter
of those a step reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from lm_eval_toolfid.engine.slot_cache import slot_cache_classes, window_layer_class

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
        self.indexed_copies = device.type != "cpu"
        """:meth:`place_many` copies the rows of one source in one indexed copy per buffer (a GPU: one kernel, not a
        launch per row and span); on the CPU a slice per row and span is faster (docs/performance.md)."""

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

    def place_many(self, kv: LayerKV, items: Sequence[tuple[int, int, KVRef]]) -> None:
        """:meth:`place` for each ``(slot, first, src)``; with :attr:`indexed_copies`, the rows whose KV is in the same
        buffers in one copy per layer's keys and values."""
        groups: dict[int, list[tuple[int, int, KVRef]]] = {}
        for item in items:
            groups.setdefault(id(item[2].kv[0][0]), []).append(item)
        for group in groups.values():
            if len(group) == 1 or not self.indexed_copies:
                for slot, first, src in group:
                    self.place(kv, slot, first, src)
                continue
            dst_row, src_row, dst_col, src_col = self._indices(group)
            for (k, v), (sk, sv) in zip(kv, group[0][2].kv):
                k[dst_row, :, dst_col] = sk[src_row, :, src_col]
                v[dst_row, :, dst_col] = sv[src_row, :, src_col]

    def _indices(self, group: Sequence[tuple[int, int, KVRef]]) -> tuple[Any, Any, Any, Any]:
        """Every copied column of ``group`` as (destination row, source row, destination column, source column)."""
        torch = self.torch
        segments = []  # (destination row, source row, destination column, source column, columns)
        for slot, first, src in group:
            col = first
            for a, n in src.spans:
                segments.append((slot, src.slot, col, a, n))
                col += n
        seg = torch.tensor(segments, dtype=torch.long)
        lengths = seg[:, 4]
        each = torch.repeat_interleave(torch.arange(len(segments)), lengths)
        within = torch.arange(int(lengths.sum())) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
        parts = (seg[each, 0], seg[each, 1], seg[each, 2] + within, seg[each, 3] + within)
        return tuple(t.to(self.device) for t in parts)  # type: ignore[return-value]

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
    live rows in slots ``0..n-1``, every one ending at column ``T`` (left padding); a step reads columns
    ``lo..T`` (the columns before ``lo`` no live row uses: dropped without copying)."""

    def __init__(self, store: KVStore, max_batch: int, spare_columns: bool) -> None:
        self.store = store
        self.max_batch = max_batch
        self.spare_columns = spare_columns
        """Allocate a quarter of ``T`` more columns than needed (CPU): rows that join later fit without moving."""
        self.kv: list[tuple[Any, Any]] = []
        self.mask: Any = None
        self.T = 0
        self.lo = 0
        self.cap = 0
        self.at: Any = None
        """The column a decode step writes, counted from its first read column: a one-element device tensor."""
        self.generation = 0
        """How many times the buffers were allocated (a captured step holds the addresses of one generation)."""
        self.opened: tuple[tuple[int, int, int], Any] | None = None
        """The last step's ``((rows, first column, generation), cache)``: a step of as many rows from the same column
        reuses its layers (their views stand where a new one's would)."""

    def join(self, n: int, joins: Sequence[tuple[int, KVRef]], need: int, waiting: int) -> None:
        """Rows ``(length, KV)`` into slots ``n..`` (``n`` live rows before them), right-aligned at ``T``.

        The buffers are reused while the rows fit: enough free slots, and room for ``need`` more columns (each
        row's remaining budget) after the live rows' and the joining rows' columns. A joining row longer than the
        live rows' columns starts left of them (or, without room there, the live rows move: once, in place).
        Otherwise they are allocated again, with room for ``waiting`` rows more up to ``max_batch``, the live rows
        copied in: once per admission at most, never per step. Live rows' masks are 0 outside their own columns."""
        torch = self.store.torch
        m = len(joins)
        width = self.T - self.lo  # the live rows' columns
        W = max([width, *(length for length, _ in joins)])  # the columns a step reads after the join
        room = bool(self.kv) and n + m <= self.kv[0][0].shape[0] and W + need <= self.cap
        if room and self.T >= W and self.T + need <= self.cap:  # nothing moves
            self.lo = self.T - W
        elif room:  # the live rows move to columns W - width..W, in place
            shift = W - width
            if n:
                for k, v in self.kv:
                    k[:n, :, shift:W] = k[:n, :, self.lo:self.T].clone()
                    v[:n, :, shift:W] = v[:n, :, self.lo:self.T].clone()
                self.mask[:n, shift:W] = self.mask[:n, self.lo:self.T].clone()
                self.mask[:n, :shift] = False
                self.mask[:n, W:] = False
            self.lo, self.T = 0, W
        else:
            slots = max(n + m, min(self.max_batch, n + m + waiting))
            # CPU: room for rows that join later without moving the others (auto caps the batch at 64 rows, memory
            # is plentiful); CUDA: exactly what auto's memory estimate counted (the whole view is usually one batch)
            cap = W + need + (W // 4 if self.spare_columns else 0)
            kv = self.store.alloc(joins[0][1].kv, slots, cap)
            mask = torch.zeros((slots, cap), dtype=torch.bool, device=self.store.device)
            if n:
                for (k, v), (ok, ov) in zip(kv, self.kv):
                    k[:n, :, W - width:W] = ok[:n, :, self.lo:self.T]
                    v[:n, :, W - width:W] = ov[:n, :, self.lo:self.T]
                mask[:n, W - width:W] = self.mask[:n, self.lo:self.T]
            self.kv, self.mask, self.cap = kv, mask, cap
            self.at = torch.zeros(1, dtype=torch.long, device=self.store.device)
            self.generation += 1
            self.opened = None
            self.lo, self.T = 0, W
        T = self.T
        self.store.place_many(self.kv, [(n + j, T - length, src) for j, (length, src) in enumerate(joins)])
        first = T - torch.tensor([length for length, _ in joins], dtype=torch.long).to(self.store.device)
        cols = torch.arange(self.cap, device=self.store.device)
        self.mask[n:n + m] = (cols >= first[:, None]) & (cols < T)  # each joining row: 1 on its own columns

    def open_step(self, n: int, shortest: int, rows: int | None = None, full: bool = False) -> tuple[Any, Any, bool]:
        """The cache, mask and whether any row is padded, for one decode step of the ``n`` live rows (``shortest``:
        the fewest columns a live row holds before the step): views of the buffers, no copy. The step's token takes
        column ``T`` (``T`` moves past it), written at the device index :attr:`at` (filled here, before the pass).
        ``rows``: the step's rows, the ``n`` live ones padded up to ``rows`` with free slots (a captured step's
        bucket: each reads its own new column; what it computes is never read); ``full``: the step reads every
        column of the buffers (a captured step's fixed window), else columns ``lo..T`` (what the live rows use)."""
        T, b = self.T, rows or n
        lo = 0 if full else self.lo
        self.mask[:b, T] = True
        self.at.fill_(T - lo)
        key = (b, lo, self.generation)
        if self.opened is None or self.opened[0] != key:
            Window = window_layer_class()
            self.opened = (key, self.store.cache([Window(k[:b, :, lo:], v[:b, :, lo:], self.at) for k, v in self.kv]))
        cache = self.opened[1]
        width = self.cap - lo if full else T + 1 - lo
        for layer in cache.layers:
            layer.width = width
        self.T = T + 1
        return cache, self.mask[:b, lo:lo + width], full or b > n or shortest < T - lo

    def move_rows(self, moves: Sequence[tuple[int, int, int]], also: Sequence[Any] = ()) -> None:
        """For each ``(src, dst, length)`` of ``moves``, slot ``src``'s last ``length`` columns (up to ``T``), its
        mask and its rows of the per-slot tensors ``also`` into slot ``dst`` (finished rows' slots taken). With
        :attr:`KVStore.indexed_copies`, one copy per buffer for all the moves, from the longest moved row's first
        column (a row's columns before its own are masked: what they hold is never read)."""
        T = self.T
        if len(moves) == 1 or not self.store.indexed_copies:
            copies: list[tuple[Any, Any, int]] = [(src, dst, T - length) for src, dst, length in moves]
        else:
            torch, device = self.store.torch, self.store.device
            src, dst = (torch.tensor(list(i), dtype=torch.long).to(device) for i in list(zip(*moves))[:2])
            copies = [(src, dst, T - max(length for _, _, length in moves))]
        for src, dst, first in copies:  # one slot each, or every moved slot at once (indexed)
            for k, v in self.kv:
                k[dst, :, first:T] = k[src, :, first:T]
                v[dst, :, first:T] = v[src, :, first:T]
            self.mask[dst] = self.mask[src]
            for t in also:
                t[dst] = t[src]

    def trim(self, n: int, longest: int) -> None:
        """``n`` live rows, the longest ``longest`` columns: steps stop reading the columns before them once they
        are a quarter of the columns read (and more than 64; nothing is copied); none left: start over at column
        0."""
        if not n:
            self.T = self.lo = 0
            return
        width = self.T - self.lo
        if width - longest > max(64, width // 4):
            self.lo = self.T - longest
