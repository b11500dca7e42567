"""The decode batch's slot buffers (engine/kv_store.py ``DecodeSlots``) and its release (engine/decode_batch.py):
through joins, steps, rows leaving (several in one step) and dropped columns, every live row reads exactly its own
columns, right-aligned, its mask 1 on them and 0 elsewhere. And a step's pick (engine/model_runner.py): argmax and
top-two gap from one ``topk``, argmax's first index where the top two tie."""

from __future__ import annotations

import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")

LAYERS, HEADS, DIM = 2, 2, 4


def _pass_kv(rows: list[tuple[float, int]], rng: random.Random) -> list[Any]:
    """The KV of rows ``(tag, length)`` after one pass, in one buffer as a pass leaves it: each row in its slot, in
    two spans (a prefix's and its own tokens') with padding around them; column c of a row's KV holds
    ``tag + c / 1024`` (keys), its negative (values)."""
    from lm_eval_toolfid.engine.kv_store import KVRef

    width = max(length for _, length in rows) + 8
    keys = torch.full((len(rows), HEADS, width, DIM), 1e30)  # what no row's spans cover is never copied
    refs = []
    for slot, (tag, length) in enumerate(rows):
        cut, gap = rng.randint(0, length), rng.randint(0, 8 - 1)
        spans = ((0, cut), (cut + gap, length - cut)) if cut else ((gap, length),)
        col = 0
        for a, n in spans:
            values = tag + torch.arange(col, col + n, dtype=torch.float32) / 1024
            keys[slot, :, a:a + n] = values.view(1, n, 1)
            col += n
        refs.append(spans)
    layers = tuple((keys, -keys) for _ in range(LAYERS))
    return [KVRef(layers, slot, spans) for slot, spans in enumerate(refs)]


class _Model:
    """What each live row should read: its own columns' values, oldest first, and its remaining budget."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []  # per slot: [column values, steps left]

    def check(self, slots: Any) -> None:
        width = slots.T - slots.lo
        for k, v in slots.kv:  # what a step reads of columns not a row's own is masked, and must be a number
            assert torch.isfinite(k[:len(self.rows), :, slots.lo:slots.T]).all()
            assert torch.isfinite(v[:len(self.rows), :, slots.lo:slots.T]).all()
        for b, (values, _) in enumerate(self.rows):
            own = len(values)
            mask = slots.mask[b, slots.lo:slots.T].tolist()
            assert mask == [0] * (width - own) + [1] * own, (b, mask)
            # 0 outside the columns read too: a captured step reads every column of the buffers
            assert not slots.mask[b, :slots.lo].any() and not slots.mask[b, slots.T:].any(), b
            want = torch.tensor(values).view(1, own, 1).expand(HEADS, own, DIM)
            for k, v in slots.kv:
                assert torch.equal(k[b, :, slots.T - own:slots.T], want), b
                assert torch.equal(v[b, :, slots.T - own:slots.T], -want), b


@pytest.mark.parametrize("indexed,graph", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("seed", range(6))
def test_rows_keep_their_own_columns_through_joins_steps_moves_and_trims(seed: int, indexed: bool, graph: bool) -> None:
    """``indexed``: joining and moving rows copied in one indexed copy per buffer (what a GPU does), else a slice
    per row and span. ``graph``: steps at a captured step's shapes (rows padded to their bucket with free slots,
    every column read, the write column a device index): the live rows' columns are the same."""
    from lm_eval_toolfid.engine.kv_store import DecodeSlots, KVStore
    from lm_eval_toolfid.engine.step_graphs import bucket_for

    rng = random.Random(seed)
    store = KVStore(torch, torch.device("cpu"), LAYERS)
    store.indexed_copies = indexed
    slots = DecodeSlots(store, max_batch=6, spare_columns=bool(seed % 2))
    model = _Model()
    tag, steps, trims = 0.0, 0, 0
    for _ in range(120):
        n = len(model.rows)
        if n < 6 and (not n or rng.random() < 0.25):  # rows of random lengths join (some longer than the rest)
            new = []
            for _ in range(rng.randint(1, 6 - n)):
                tag += 1
                new.append((tag, rng.choice([3, 10, 70, 150, 300])))
                model.rows.append([[tag + c / 1024 for c in range(new[-1][1])], rng.randint(1, 60)])
            cut = rng.randint(1, len(new))  # from one pass or two
            refs = _pass_kv(new[:cut], rng) + (_pass_kv(new[cut:], rng) if cut < len(new) else [])
            joins = [(length, ref) for (_, length), ref in zip(new, refs)]
            # as the engine asks: room for every row's remaining budget
            slots.join(n, joins, need=max(left for _, left in model.rows) + 1, waiting=rng.randint(0, 4))
        else:  # a step: every live row appends a column, then rows leave (several at once, budgets spent or not)
            steps += 1
            lo, T, shortest = slots.lo, slots.T, min(len(r[0]) for r in model.rows)
            b = bucket_for(n, slots.kv[0][0].shape[0]) if graph else n
            cache, mask, padded = slots.open_step(n, shortest, b, full=graph)
            assert mask.shape == ((b, slots.cap) if graph else (n, slots.T - slots.lo))
            assert padded == (graph or shortest < T - lo)
            assert int(slots.at) == (T if graph else T - lo) and mask[:, -1 if not graph else T].all()
            step = torch.tensor([-steps - r / 128 for r in range(b)])
            new = step.view(b, 1, 1, 1).expand(b, HEADS, 1, DIM)
            for layer in cache.layers:
                keys, _ = layer.update(new, -new)
                assert keys.shape[2] == mask.shape[1]
            for b, row in enumerate(model.rows):
                row[0].append(float(step[b]))
                row[1] -= 1
            done = sorted({b for b in range(n) if model.rows[b][1] == 0} | set(rng.sample(range(n), rng.randint(0, min(2, n)))))
            rows, slot = list(model.rows), list(range(n))  # the engine's release: the last live row moves in
            for b in reversed(done):
                if b != len(rows) - 1:
                    rows[b], slot[b] = rows[-1], slot[-1]
                rows.pop()
                slot.pop()
            moves = [(src, dst, len(rows[dst][0])) for dst, src in enumerate(slot) if src != dst]
            if moves:
                slots.move_rows(moves)
            model.rows = rows
            lo = slots.lo
            slots.trim(len(rows), max((len(r[0]) for r in rows), default=0))
            trims += slots.lo > lo
        model.check(slots)
    assert steps > 20 and trims  # the schedule met what it is meant to test


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pick_gives_argmax_and_the_top_two_gap_ties_and_nan_included(dtype: str) -> None:
    from lm_eval_toolfid.engine.model_runner import ModelRunner

    from types import SimpleNamespace

    runner = ModelRunner.__new__(ModelRunner)  # pick reads nothing of the model, only whether LoRA rows are routed
    runner.torch = torch
    runner.adapters = SimpleNamespace(lora=None)
    gen = torch.Generator().manual_seed(0)
    for trial in range(40):
        logits = torch.randint(0, 4, (6, 3, 40), generator=gen).to(getattr(torch, dtype)).float()  # ties everywhere
        if trial % 4 == 0:
            logits[0, 0, 5] = float("nan")
            logits[1, 2] = float("-inf")
            logits[2, 1, :2] = float("inf")
        out = torch.full((6, 3), -1, dtype=torch.long)
        best, gaps = runner.pick(logits, with_gaps=True, out=out)
        want = logits.argmax(dim=-1)
        top = torch.topk(logits, 2, dim=-1).values
        assert best == want.tolist() and torch.equal(out, want)
        assert torch.equal(torch.tensor(gaps), top[..., 0] - top[..., 1]) or torch.allclose(
            torch.tensor(gaps), top[..., 0] - top[..., 1], equal_nan=True, rtol=0, atol=0)
        plain, none = runner.pick(logits, with_gaps=False)
        assert plain == want.tolist() and none == []
