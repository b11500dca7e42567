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
    ids = torch.full((B, S), runner.pad_id, dtype=torch.long)
    mask = torch.zeros((B, P + S), dtype=torch.long)
    positions = torch.zeros((B, S), dtype=torch.long)
    spans: list[tuple[tuple[int, int], ...]] = []
    for r, e in enumerate(entries):
        p, n = e.depth, len(e.tokens)
        ids[r, S - n:] = torch.tensor(list(e.tokens), dtype=torch.long)
        mask[r, P - p:P] = 1
        mask[r, P + S - n:] = 1
        positions[r, S - n:] = torch.arange(p, p + n)
        spans.append(((P - p, p),) * bool(p) + ((P + S - n, n),))
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
