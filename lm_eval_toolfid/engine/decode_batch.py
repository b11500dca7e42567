"""The decode batch: rows that join it (:meth:`DecodeBatch.join`), one decode step for every live row
(:meth:`DecodeBatch.step`), and the release of rows that stop there (their slots taken by the last live rows). Its
KV lives in :class:`~lm_eval_toolfid.engine.kv_store.DecodeSlots`."""

from __future__ import annotations

from typing import Sequence

from lm_eval_toolfid.engine.acceptance import take_token
from lm_eval_toolfid.engine.config import EngineConfig
from lm_eval_toolfid.engine.handoffs import Joining
from lm_eval_toolfid.engine.kv_store import DecodeSlots, KVStore
from lm_eval_toolfid.engine.model_runner import ModelRunner
from lm_eval_toolfid.engine.rows import LiveRow


class DecodeBatch:
    """Live rows (row b's cache is slot b of the buffers), right-aligned at column ``T`` (left padding)."""

    def __init__(self, runner: ModelRunner, store: KVStore, config: EngineConfig, near_tie: float) -> None:
        self.runner, self.config, self.near_tie = runner, config, near_tie
        self.rows: list[LiveRow] = []
        self.slots = DecodeSlots(store, config.max_batch, spare_columns=runner.device.type == "cpu")

    def join(self, joining: Sequence[Joining], waiting: int) -> None:
        """Put the joining rows into free slots (``waiting``: rows not yet admitted, room a new buffer may keep
        for them)."""
        # each row appends at most (budget - emitted) more columns
        need = max(live.row.max_new - len(live.result.tokens) for live in [*self.rows, *(j.live for j in joining)]) + 1
        self.slots.join(len(self.rows), [(j.live.length, j.kv) for j in joining], need, waiting)
        self.rows.extend(j.live for j in joining)

    def step(self) -> list[LiveRow]:
        """One decode step for every live row (slots ``0..n-1`` of the buffers: views, no copy); returns the rows
        that stopped, which leave at once."""
        torch, runner, record = self.runner.torch, self.runner, self.config.record_gaps
        n = len(self.rows)
        ids = torch.tensor([[live.pending] for live in self.rows], dtype=torch.long)
        positions = torch.tensor([[len(live.row.prompt) + len(live.result.tokens) - 1] for live in self.rows],
                                 dtype=torch.long)
        cache, mask = self.slots.open_step(n)
        logits = runner.forward(ids, mask, positions, cache, 1, step=True, views=[live.row.view for live in self.rows])
        best, gaps = runner.pick(logits, with_gaps=record or runner.joint
                                                   or any(live.result.shared for live in self.rows))
        finished, done = [], []
        for b, live in enumerate(self.rows):
            token = best[b][0]
            live.length += 1
            if take_token(live.result, live.row, token, gaps[b][0] if gaps else 0.0, verified=False,
                          near_tie=self.near_tie, record=record):
                finished.append(live)
                done.append(b)
            else:
                live.pending = token
        if done:
            self._release(done)
        return finished

    def _release(self, done: list[int]) -> None:
        """Free the slots of finished rows: the last live row moves into each (one row copied, not the batch)."""
        for b in sorted(done, reverse=True):
            last = len(self.rows) - 1
            if b != last:
                self.slots.move(last, b, self.rows[last].length)
                self.rows[b] = self.rows[last]
            self.rows.pop()
        self.slots.trim(len(self.rows), max((live.length for live in self.rows), default=0))
