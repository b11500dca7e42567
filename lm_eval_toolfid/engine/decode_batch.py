"""The decode batch: rows that join it (:meth:`DecodeBatch.join`), one decode step for every live row
(:meth:`DecodeBatch.step`), and the release of rows that stop there (their slots taken by the last live rows). Its
KV lives in :class:`~lm_eval_toolfid.engine.kv_store.DecodeSlots`."""

from __future__ import annotations

from typing import Any, Sequence

from lm_eval_toolfid.engine.acceptance import take_token
from lm_eval_toolfid.engine.config import RunContext
from lm_eval_toolfid.engine.handoffs import Joining
from lm_eval_toolfid.engine.kv_store import DecodeSlots, KVStore
from lm_eval_toolfid.engine.model_runner import ModelRunner
from lm_eval_toolfid.engine.rows import LiveRow
from lm_eval_toolfid.engine.step_graphs import StepGraphs, bucket_for


class DecodeBatch:
    """Live rows (row b's cache is slot b of the buffers), right-aligned at column ``T`` (left padding)."""

    def __init__(self, runner: ModelRunner, store: KVStore, context: RunContext) -> None:
        self.runner, self.context, self.config = runner, context, context.config
        self.rows: list[LiveRow] = []
        self.slots = DecodeSlots(store, context.config.max_batch, spare_columns=runner.device.type == "cpu")
        self.ids: Any = None
        """Slot b's next input token, ``[slots, 1]`` on the model's device: a step's argmax is copied in there (no
        ids built from Python lists, no host-to-device copy per step)."""
        self.positions: Any = None
        """Slot b's position, ``[slots, 1]`` on the model's device (one added per step)."""
        self.view_ids: Any = None
        """Slot b's view, ``[slots]`` on the model's device: its index in the run's views (a joint run), for adapter
        routing that reads it on the device (:attr:`ModelRunner.routes_on_device`)."""
        self.shared = 0
        """Live rows on a shared prefix (their tokens need top-two gaps: :func:`take_token`)."""
        self.graphs = step_graphs_for(runner, context)
        """The captured steps (None: every step launched op by op)."""

    def join(self, joining: Sequence[Joining], waiting: int) -> None:
        """Put the joining rows into free slots (``waiting``: rows not yet admitted, room a new buffer may keep
        for them)."""
        # each row appends at most (budget - emitted) more columns
        need = max(live.row.max_new - len(live.result.tokens) for live in [*self.rows, *(j.live for j in joining)]) + 1
        n = len(self.rows)
        self.slots.join(n, [(j.live.length, j.kv) for j in joining], need, waiting)
        self.rows.extend(j.live for j in joining)
        self.shared += sum(1 for j in joining if j.live.result.shared)
        self._place_inputs(n, [j.live for j in joining])

    def _place_inputs(self, n: int, lives: Sequence[LiveRow]) -> None:
        """The joining rows' next token and position into slots ``n..`` (the buffers grown with the slots)."""
        torch, device = self.runner.torch, self.runner.device
        slots = self.slots.kv[0][0].shape[0]
        if self.ids is None or self.ids.shape[0] < slots:
            ids, positions = (torch.zeros((slots, 1), dtype=torch.long, device=device) for _ in range(2))
            view_ids = torch.zeros(slots, dtype=torch.long, device=device)
            if n:
                ids[:n], positions[:n], view_ids[:n] = self.ids[:n], self.positions[:n], self.view_ids[:n]
            self.ids, self.positions, self.view_ids = ids, positions, view_ids
        views = self.context.views
        new = torch.tensor([[live.pending, len(live.row.prompt) + len(live.result.tokens) - 1,
                             views.index(live.row.view) if views else 0] for live in lives],
                           dtype=torch.long).to(device)
        self.ids[n:n + len(lives)] = new[:, :1]
        self.positions[n:n + len(lives)] = new[:, 1:2]
        self.view_ids[n:n + len(lives)] = new[:, 2]

    def step(self) -> list[LiveRow]:
        """One decode step for every live row (slots ``0..n-1`` of the buffers: views, no copy); returns the rows
        that stopped, which leave at once."""
        runner, record, joint = self.runner, self.config.record_gaps, self.context.joint
        n, slots = len(self.rows), self.slots
        bucket = bucket_for(n, slots.kv[0][0].shape[0])
        graphed = self.graphs is not None and self.graphs.usable(bucket)
        # at a captured step's shapes (rows padded to the bucket, every column read): replayed, or rehearsed eagerly
        shaped = graphed or (self.config.graph_shapes and self.graphs is None and bucket <= self.config.max_graph_rows)
        rows = bucket if shaped else n  # the step's rows: padded to its bucket where a graph is (or would be) replayed
        cache, mask, padded = slots.open_step(n, min(live.length for live in self.rows), rows, full=shaped)
        views = [live.row.view for live in self.rows] + [None] * (rows - n) if joint else None

        def forward() -> Any:
            return runner.forward(self.ids[:rows], mask, self.positions[:rows], cache, 1, step=True, views=views,
                                  padded=padded, view_index=self.view_ids[:rows])

        logits = self.graphs.run(rows, slots.generation, forward) if graphed else forward()
        best, gaps = runner.pick(logits[:n], with_gaps=record or joint or self.shared > 0, out=self.ids[:n])
        self.positions[:n] += 1
        finished, done = [], []
        for b, live in enumerate(self.rows):
            token = best[b][0]
            live.length += 1
            if take_token(live.result, live.row, token, gaps[b][0] if gaps else 0.0, verified=False,
                          near_tie=self.context.near_tie, record=record):
                finished.append(live)
                done.append(b)
            else:
                live.pending = token
        if done:
            self._release(done)
        return finished

    def _release(self, done: list[int]) -> None:
        """Free the slots of finished rows: the last live row moves into each (one row copied, not the batch; on a
        GPU the rows of one step in one copy per buffer)."""
        rows = self.rows
        self.shared -= sum(1 for b in done if rows[b].result.shared)
        slot = list(range(len(rows)))  # the slot each row of ``rows`` holds its KV in now
        for b in sorted(done, reverse=True):
            last = len(rows) - 1
            if b != last:
                rows[b], slot[b] = rows[last], slot[last]
            rows.pop()
            slot.pop()
        moves = [(src, dst, rows[dst].length) for dst, src in enumerate(slot) if src != dst]
        if moves:
            self.slots.move_rows(moves, also=(self.ids, self.positions, self.view_ids))
        self.slots.trim(len(rows), max((live.length for live in rows), default=0))


def step_graphs_for(runner: ModelRunner, context: RunContext) -> StepGraphs | None:
    """The run's captured steps: with ``cuda_graphs`` on a CUDA model, unless the run is joint and its adapter
    routing is built on the host (PEFT's mixed batch: such a run steps eagerly, the same tokens)."""
    if not context.config.cuda_graphs or runner.device.type != "cuda":
        return None
    if context.joint and not runner.routes_on_device:
        return None
    return StepGraphs(runner.torch, runner.stats, max_rows=context.config.max_graph_rows)
