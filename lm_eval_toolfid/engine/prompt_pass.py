"""The prompt pass stage: the shared prefixes admitted rows start from (:class:`PrefixPasses`, each computed once on
top of its nearest computed ancestor, :mod:`lm_eval_toolfid.engine.prefix_cache`), then each group's prompts in one
pass (:class:`PromptPass`), which reads every row's first token and hands the row on as finished, joining the decode
batch, or drafting (its first token matched its draft). The passes and their groups are the scheduler's
(:mod:`~lm_eval_toolfid.engine.scheduler`)."""

from __future__ import annotations

from typing import Sequence

from lm_eval_toolfid.engine.acceptance import accept_predictions
from lm_eval_toolfid.engine.config import RunContext
from lm_eval_toolfid.engine.handoffs import Admitted, RowState, StageResult
from lm_eval_toolfid.engine.kv_store import KVRef, KVStore
from lm_eval_toolfid.engine.model_runner import ModelRunner
from lm_eval_toolfid.engine.passes import PassEntry, run_pass
from lm_eval_toolfid.engine.prefix_cache import PrefixPlan, PrefixStore
from lm_eval_toolfid.engine.rows import LiveRow, RowResult

__all__ = ["Admitted", "PrefixPasses", "PromptPass", "SharedPrefixes"]


class SharedPrefixes:
    """The run's prefix plan and the KV of its computed nodes (none without a plan)."""

    def __init__(self, plan: PrefixPlan | None) -> None:
        self.plan = plan
        self.store = PrefixStore(plan) if plan is not None else None

    def depth(self, node: int | None) -> int:
        return self.plan.depth(node) if self.plan is not None else 0

    def kv(self, node: int | None) -> KVRef | None:
        """The node's KV (a one-row buffer per layer), None for no node."""
        if node is None:
            return None
        return KVRef(tuple(self.store.get(node)), 0, ((0, self.depth(node)),))  # type: ignore[union-attr]


class PrefixPasses:
    """Computes shared prefixes a pass of nodes at a time, in the passes the scheduler makes, each node on top of its
    parent's KV; each node's KV is held for the rows and nodes under it."""

    def __init__(self, runner: ModelRunner, store: KVStore, context: RunContext, prefixes: SharedPrefixes) -> None:
        self.runner, self.store, self.context, self.prefixes = runner, store, context, prefixes

    def run(self, group: Sequence[int]) -> None:
        """One pass over the nodes ``group`` (each node's parent already computed)."""
        plan, held = self.prefixes.plan, self.prefixes.store
        assert plan is not None and held is not None
        entries = []
        for n in group:
            node = plan.nodes[n]
            p = plan.depth(node.parent)
            entries.append(PassEntry(self.prefixes.kv(node.parent), p, plan.prompts[node.row][p:node.depth],
                                     plan.view_of(node.row)))
        out = run_pass(self.runner, self.store, entries, self.context.joint)
        for n, kv in zip(group, out.kv):
            held.put(n, self.store.gather(kv))


class PromptPass:
    """A group's prompts in one pass — exactly the plain path's prompt pass, so every row's first token is plain
    decoding's (a row on a shared prefix computes only the rest of its prompt, on the prefix's KV)."""

    def __init__(self, runner: ModelRunner, store: KVStore, context: RunContext, prefixes: SharedPrefixes) -> None:
        self.runner, self.store, self.context, self.prefixes = runner, store, context, prefixes

    def run(self, group: Sequence[Admitted]) -> StageResult:
        """Rows come back finished, joining (decode from here) or drafting (the first token matched the draft:
        check the rest), each with where its KV is; the prompt tokens they took from shared prefixes are
        counted."""
        prefixes = self.prefixes
        entries = []
        for a in group:
            p = prefixes.depth(a.node)
            entries.append(PassEntry(prefixes.kv(a.node), p, a.row.prompt[p:], a.row.view))
        context, record = self.context, self.context.config.record_gaps
        out = run_pass(self.runner, self.store, entries, context.joint)
        shared = any(a.node is not None for a in group)
        best, gaps = self.runner.pick(out.logits, with_gaps=record or shared or context.joint)
        refs = out.kv
        del out
        states: list[tuple[RowState, LiveRow, KVRef]] = []
        shared_tokens = 0
        for r, a in enumerate(group):
            row = a.row
            live = LiveRow(index=a.index, row=row, result=RowResult(draft_len=len(row.draft),
                                                                    shared=prefixes.depth(a.node),
                                                                    joint=context.joint,
                                                                    lora=context.stacked_row(row.view)))
            state = accept_predictions(live, [(best[r][0], gaps[r][0] if gaps else 0.0)], verified=False,
                                       near_tie=context.near_tie, record=record)
            if state is RowState.DECODE:
                live.length = len(row.prompt)
            states.append((state, live, refs[r]))
            if a.node is not None:
                shared_tokens += prefixes.depth(a.node)
                prefixes.store.release(a.node)  # type: ignore[union-attr]
        return StageResult.of(states, shared_tokens)
