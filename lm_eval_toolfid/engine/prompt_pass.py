"""The prompt pass stage: the shared prefixes admitted rows start from (:class:`PrefixPasses`, each computed once on
top of its nearest computed ancestor, :mod:`lm_eval_toolfid.engine.prefix_cache`), then each group's prompts in one
pass (:class:`PromptPass`), which reads every row's first token and hands the row on as finished, joining the decode
batch, or drafting (its first token matched its draft)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from lm_eval_toolfid.engine.acceptance import accept_predictions
from lm_eval_toolfid.engine.config import EngineConfig
from lm_eval_toolfid.engine.handoffs import StageResult, RowState
from lm_eval_toolfid.engine.kv_store import KVRef, KVStore
from lm_eval_toolfid.engine.model_runner import ModelRunner
from lm_eval_toolfid.engine.passes import PassEntry, run_pass, sibling_groups
from lm_eval_toolfid.engine.prefix_cache import PrefixPlan, PrefixStore, prefix_key
from lm_eval_toolfid.engine.rows import LiveRow, Row, RowResult


@dataclass(frozen=True)
class Admitted:
    """A row admitted to its prompt pass: its index in the run, and the shared prefix it starts from (a node of
    the view's :class:`PrefixPlan`; None: from the start)."""

    index: int
    row: Row
    node: int | None = None


class SharedPrefixes:
    """The view's prefix plan and the KV of its computed nodes (none without a plan)."""

    def __init__(self, plan: PrefixPlan | None) -> None:
        self.plan = plan
        self.store = PrefixStore(plan) if plan is not None else None

    def node_of(self, index: int) -> int | None:
        return self.plan.row_node[index] if self.plan is not None else None

    def depth(self, node: int | None) -> int:
        return self.plan.depth(node) if self.plan is not None else 0

    def kv(self, node: int | None) -> KVRef | None:
        """The node's KV (a one-row buffer per layer), None for no node."""
        if node is None:
            return None
        return KVRef(tuple(self.store.get(node)), 0, ((0, self.depth(node)),))  # type: ignore[union-attr]


class PrefixPasses:
    """Computes the shared prefixes rows start from (and their ancestors), each once, on top of its nearest computed
    ancestor: nodes whose parent is ready go together, in length-matched passes."""

    def __init__(self, runner: ModelRunner, store: KVStore, config: EngineConfig, prefixes: SharedPrefixes) -> None:
        self.runner, self.store, self.config, self.prefixes = runner, store, config, prefixes

    def compute(self, needed: set[int]) -> None:
        plan, held = self.prefixes.plan, self.prefixes.store
        assert plan is not None and held is not None
        todo: list[int] = []
        for node in sorted(needed):  # the node and its ancestors up to the first one already computed
            chain: list[int] = []
            while node is not None and node not in held:
                chain.append(node)
                node = plan.nodes[node].parent
            todo += chain[::-1]
        todo = list(dict.fromkeys(todo))
        own = lambda n: plan.nodes[n].depth - plan.depth(plan.nodes[n].parent)  # noqa: E731
        while todo:
            ready = [n for n in todo if plan.nodes[n].parent is None or plan.nodes[n].parent in held]
            # a prefix's nodes of every view (a joint run) go through one pass: the same kernels for each
            sibling = (lambda n: (plan.nodes[n].depth, prefix_key(plan.prompts[plan.nodes[n].row], plan.nodes[n].depth))
                       ) if plan.views else (lambda n: n)
            ready.sort(key=lambda n: (-own(n), sibling(n)) if plan.views else -own(n))
            for group in sibling_groups(ready, own, self.config.prefill_tokens, self.config.max_padding, sibling):
                entries = []
                for n in group:
                    node = plan.nodes[n]
                    p = plan.depth(node.parent)
                    entries.append(PassEntry(self.prefixes.kv(node.parent), p, plan.prompts[node.row][p:node.depth],
                                             plan.view_of(node.row)))
                out = run_pass(self.runner, self.store, entries)
                for n, kv in zip(group, out.kv):
                    held.put(n, self.store.gather(kv))
            todo = [n for n in todo if n not in held]


class PromptPass:
    """A group's prompts in one pass — exactly the plain path's prompt pass, so every row's first token is plain
    decoding's (a row on a shared prefix computes only the rest of its prompt, on the prefix's KV)."""

    def __init__(self, runner: ModelRunner, store: KVStore, config: EngineConfig, near_tie: float,
                 prefixes: SharedPrefixes) -> None:
        self.runner, self.store, self.config, self.near_tie, self.prefixes = runner, store, config, near_tie, prefixes

    def run(self, group: Sequence[Admitted]) -> StageResult:
        """Rows come back finished, joining (decode from here) or drafting (the first token matched the draft:
        check the rest), each with where its KV is; the prompt tokens they took from shared prefixes are
        counted."""
        prefixes = self.prefixes
        entries = []
        for a in group:
            p = prefixes.depth(a.node)
            entries.append(PassEntry(prefixes.kv(a.node), p, a.row.prompt[p:], a.row.view))
        out = run_pass(self.runner, self.store, entries)
        shared = any(a.node is not None for a in group)
        best, gaps = self.runner.pick(out.logits, with_gaps=self.config.record_gaps or shared or self.runner.joint)
        refs = out.kv
        del out
        states: list[tuple[RowState, LiveRow, KVRef]] = []
        shared_tokens = 0
        for r, a in enumerate(group):
            row = a.row
            live = LiveRow(index=a.index, row=row, result=RowResult(draft_len=len(row.draft),
                                                                    shared=prefixes.depth(a.node),
                                                                    joint=self.runner.joint))
            state = accept_predictions(live, [(best[r][0], gaps[r][0] if gaps else 0.0)], verified=False,
                                       near_tie=self.near_tie, record=self.config.record_gaps)
            if state is RowState.DECODE:
                live.length = len(row.prompt)
            states.append((state, live, refs[r]))
            if a.node is not None:
                shared_tokens += prefixes.depth(a.node)
                prefixes.store.release(a.node)  # type: ignore[union-attr]
        return StageResult.of(states, shared_tokens)
