"""One prompt-side forward pass over rows that may start from a shared prefix's KV (:func:`run_pass`); which rows go
together is the scheduler's (:mod:`~lm_eval_toolfid.engine.scheduler`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from lm_eval_toolfid.engine.kv_store import KVRef, KVStore
from lm_eval_toolfid.engine.model_runner import ModelRunner


@dataclass(frozen=True)
class PassEntry:
    """One row of a pass: the tokens to compute, after ``depth`` columns of prefix KV (``prefix``; none at 0)."""

    prefix: KVRef | None
    depth: int
    tokens: Sequence[int]
    view: str | None = None
    """The row's adapter in a joint run (:attr:`~lm_eval_toolfid.engine.rows.Row.view`)."""


@dataclass(frozen=True)
class PassOut:
    """A pass's logits (the last ``keep`` columns) and where each entry's KV now is."""

    logits: Any
    kv: tuple[KVRef, ...]


def run_pass(runner: ModelRunner, store: KVStore, entries: Sequence[PassEntry], joint: bool, keep: int = 1) -> PassOut:
    """One forward pass of ``entries`` in one batch: each prefix right-aligned at column P (left padding), the tokens
    after it left-padded to width S, explicit mask and positions. Without prefixes this is exactly the plain prompt
    pass. Each entry's KV is its prefix's span and its tokens' span, in order. ``joint``: the pass names each entry's
    adapter (its ``view``)."""
    torch = runner.torch
    P = max(e.depth for e in entries)
    S = max(len(e.tokens) for e in entries)
    B = len(entries)
    id_rows, mask_rows, position_rows = [], [], []  # built on the host as lists: one tensor each, not a copy a row
    spans: list[tuple[tuple[int, int], ...]] = []
    for e in entries:
        p, n = e.depth, len(e.tokens)
        id_rows.append([runner.pad_id] * (S - n) + list(e.tokens))
        mask_rows.append([0] * (P - p) + [1] * p + [0] * (S - n) + [1] * n)
        position_rows.append([0] * (S - n) + list(range(p, p + n)))
        spans.append(((P - p, p),) * bool(p) + ((P + S - n, n),))
    ids, mask, positions = (torch.tensor(rows, dtype=torch.long) for rows in (id_rows, mask_rows, position_rows))
    if P == 0:
        cache = store.empty_cache(S)
    else:
        kv = store.alloc(next(e.prefix for e in entries if e.depth).kv, B, P + S)
        store.place_many(kv, [(r, P - e.depth, e.prefix) for r, e in enumerate(entries) if e.depth])
        cache = store.cache(store.layers(kv, P))
    padded = any(e.depth < P or len(e.tokens) < S for e in entries)
    ids, mask, positions = (t.to(runner.device) for t in (ids, mask, positions))
    views = [e.view for e in entries] if joint else None
    logits = runner.forward(ids, mask, positions, cache, keep, views=views, padded=padded,
                            tokens=sum(len(e.tokens) for e in entries),
                            view_index=runner.view_ids(views) if views is not None and runner.routes_on_device else None)
    return PassOut(logits, tuple(KVRef.of_layers(cache.layers, r, s) for r, s in enumerate(spans)))
