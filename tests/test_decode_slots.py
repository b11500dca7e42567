"""The decode batch's slot buffers (engine/kv_store.py ``DecodeSlots``) and its release (engine/decode_batch.py):
through joins, steps, rows leaving (several in one step) and dropped columns, every live row reads exactly its own
columns, right-aligned, its mask 1 on them and 0 elsewhere, and its next input and position follow it."""

from __future__ import annotations

import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")

LAYERS, HEADS, DIM = 2, 2, 4


def _row_kv(tag: float, length: int) -> Any:
    """One row's KV from a pass: column c of it holds ``tag + c / 1024`` (keys), its negative (values)."""
    from lm_eval_toolfid.engine.kv_store import KVRef

    col = (tag + torch.arange(length, dtype=torch.float32) / 1024).view(1, 1, length, 1)
    keys = col.expand(1, HEADS, length, DIM).clone()
    return KVRef(tuple((keys, -keys) for _ in range(LAYERS)), 0, ((0, length),))


class _Model:
    """What each live row should read: its own columns' values, oldest first, and its remaining budget."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []  # per slot: [column values, steps left]

    def check(self, slots: Any) -> None:
        width = slots.T - slots.lo
        for b, (values, _) in enumerate(self.rows):
            own = len(values)
            mask = slots.mask[b, slots.lo:slots.T].tolist()
            assert mask == [0] * (width - own) + [1] * own, (b, mask)
            want = torch.tensor(values).view(1, own, 1).expand(HEADS, own, DIM)
            for k, v in slots.kv:
                assert torch.equal(k[b, :, slots.T - own:slots.T], want), b
                assert torch.equal(v[b, :, slots.T - own:slots.T], -want), b


@pytest.mark.parametrize("seed", range(8))
def test_rows_keep_their_own_columns_through_joins_steps_moves_and_trims(seed: int) -> None:
    from lm_eval_toolfid.engine.kv_store import DecodeSlots, KVStore

    rng = random.Random(seed)
    store = KVStore(torch, torch.device("cpu"), LAYERS)
    slots = DecodeSlots(store, max_batch=6, spare_columns=bool(seed % 2))
    model = _Model()
    tag, steps, trims, joins_moved = 0.0, 0, 0, 0
    for _ in range(120):
        n = len(model.rows)
        if n < 6 and (not n or rng.random() < 0.25):  # rows of random lengths join (some longer than the rest)
            joins = []
            for _ in range(rng.randint(1, 6 - n)):
                tag += 1
                length = rng.choice([3, 10, 70, 150, 300])
                joins.append((length, _row_kv(tag, length)))
                model.rows.append([[tag + c / 1024 for c in range(length)], rng.randint(1, 60)])
            before = (slots.lo, slots.T, slots.cap)
            # as the engine asks: room for every row's remaining budget
            slots.join(n, joins, need=max(left for _, left in model.rows) + 1, waiting=rng.randint(0, 4))
            joins_moved += bool(n) and before[2] == slots.cap and slots.lo == 0 and before[0] > 0
        else:  # a step: every live row appends a column, then rows leave (several at once, budgets spent or not)
            steps += 1
            cache, mask = slots.open_step(n)
            assert mask.shape == (n, slots.T - slots.lo)
            step = torch.tensor([-steps - b / 128 for b in range(n)])
            new = step.view(n, 1, 1, 1).expand(n, HEADS, 1, DIM)
            for layer in cache.layers:
                layer.update(new, -new)
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
            moves = [(src, dst) for dst, src in enumerate(slot) if src != dst]
            if moves:
                slots.move_rows(moves, max(len(rows[d][0]) for _, d in moves))
            model.rows = rows
            lo = slots.lo
            slots.trim(len(rows), max((len(r[0]) for r in rows), default=0))
            trims += slots.lo > lo
        model.check(slots)
    assert steps > 20 and trims  # the schedule met what it is meant to test
