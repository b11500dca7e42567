"""The draft verification stage: the drafts of a group of rows whose tokens have all matched so far, a chunk per
pass (a first ``first_chunk`` probe, then the rest within the logits budget), on one cache that holds each row's
prompt right-aligned (copied from its prompt pass). Rows come back finished or joining the decode batch; rows whose
view stopped drafting (the scheduler's draft budget) join it from their prompt pass instead
(:func:`decode_without_drafts`)."""

from __future__ import annotations

from typing import Any, Sequence

from lm_eval_toolfid.engine.acceptance import accept_predictions
from lm_eval_toolfid.engine.config import RunContext
from lm_eval_toolfid.engine.handoffs import Drafting, Joining, RowState, StageResult
from lm_eval_toolfid.engine.kv_store import KVRef, KVStore
from lm_eval_toolfid.engine.model_runner import ModelRunner
from lm_eval_toolfid.engine.rows import LiveRow


class DraftVerifier:
    """Verifies the drafts of groups of rows (:meth:`verify`)."""

    def __init__(self, runner: ModelRunner, store: KVStore, context: RunContext) -> None:
        self.runner, self.store, self.context, self.config = runner, store, context, context.config

    def chunk(self, rows: int) -> int:
        """Draft tokens per verification pass after the first: logits stay within ``verify_logits``."""
        return max(8, self.config.verify_logits // max(1, rows * self.runner.fit.vocab))

    def verify(self, group: Sequence[Drafting]) -> StageResult:
        """Verify the group's drafts (rows of like prompt length) until each row stops or diverges."""
        torch, runner, store = self.runner.torch, self.runner, self.store
        lives = [d.live for d in group]
        rows = [live.row for live in lives]
        T = max(len(row.prompt) for row in rows)
        cap = T + min(max(len(row.draft) for row in rows), self.config.first_chunk)
        kv = store.alloc(group[0].kv.kv, len(rows), cap)
        starts = [T - len(row.prompt) for row in rows]
        store.place_many(kv, [(j, starts[j], d.kv) for j, d in enumerate(group)])  # a GPU: one copy per source
        layers = store.layers(kv, T)
        mask = torch.tensor([[0] * start + [1] * (T - start) for start in starts], dtype=torch.long)
        fed = [0] * len(rows)  # draft tokens in the cache
        members, again = list(range(len(rows))), list(range(len(rows)))
        chunk = self.config.first_chunk
        outcome = StageResult()
        while again:
            sel = [members.index(r) for r in again]
            layers, mask = self._select(layers, mask, sel)
            members, todo, again = again, again, []
            C = min(max(len(rows[r].draft) - fed[r] for r in todo), chunk)
            chunk = self.chunk(len(todo))  # the first chunk probes; the next ones take the rest
            width = mask.shape[1]
            chunks = [list(rows[r].draft[fed[r]:fed[r] + C]) for r in todo]  # one tensor each, not a copy a row
            ids = torch.tensor([c + [runner.pad_id] * (C - len(c)) for c in chunks], dtype=torch.long)
            cmask = torch.tensor([[1] * len(c) + [0] * (C - len(c)) for c in chunks], dtype=torch.long)
            mask = torch.cat([mask, cmask], dim=1)
            start = torch.tensor([len(rows[r].prompt) + fed[r] for r in todo], dtype=torch.long)
            positions = start[:, None] + torch.arange(C)[None, :]
            for layer in layers:  # room for this chunk
                layer.reserve(width + C)
            device = runner.device  # the host's mask says whether any row is padded (no device round trip)
            views = [rows[r].view for r in todo] if self.context.joint else None
            index = runner.view_ids(views) if views is not None and runner.routes_on_device else None
            logits = runner.forward(ids.to(device), mask.to(device), positions.to(device), store.cache(layers), C,
                                    views=views, padded=not bool(mask.all()), tokens=sum(map(len, chunks)),
                                    view_index=index)
            best, gaps = runner.pick(logits)
            del logits
            states: list[tuple[RowState, LiveRow, KVRef]] = []
            for j, r in enumerate(todo):
                n = len(chunks[j])
                fed[r] += n
                live = lives[r]
                state = accept_predictions(live, list(zip(best[j][:n], gaps[j][:n])), verified=True,
                                           near_tie=self.context.near_tie, record=self.config.record_gaps)
                if state is RowState.VERIFY:
                    again.append(r)
                    continue
                if state is RowState.DECODE:
                    live.length = len(live.row.prompt) + live.result.accepted
                states.append((state, live, KVRef.of_layers(layers, j, [(starts[r], live.length)])))
            outcome += StageResult.of(states)
        return outcome

    def _select(self, layers: list[Any], mask: Any, sel: list[int]) -> tuple[list[Any], Any]:
        """Only rows ``sel`` of the cache and mask (unchanged when that is all of them)."""
        if sel == list(range(mask.shape[0])):
            return layers, mask
        torch = self.runner.torch
        return self.store.select(layers, sel), mask.index_select(0, torch.tensor(sel, dtype=torch.long))


def decode_without_drafts(group: Sequence[Drafting]) -> StageResult:
    """Rows whose first token matched their draft, sent to the decode batch instead of verified: from the KV and
    first token of their prompt pass, as plain decoding's rows join it, so their tokens are plain decoding's."""
    joining = []
    for d in group:
        live = d.live
        live.result.draft_dropped = True
        live.pending = live.result.tokens[-1]
        live.length = len(live.row.prompt)
        joining.append(Joining(live, d.kv))
    return StageResult(joining=tuple(joining))
