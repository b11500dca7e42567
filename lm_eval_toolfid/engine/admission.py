"""Admission: the order rows are admitted in (:func:`admission_order`: sorted by prompt when prefixes are shared,
so a prefix's rows come together; else longest first), and :class:`Admission`, which runs the passes that bring
admitted rows to the decode batch — their shared prefixes, their prompt passes (groups of like length), then the
verification of the drafts whose first token matched (groups of like prompt length)."""

from __future__ import annotations

from collections import deque
from typing import Sequence

from lm_eval_toolfid.engine.config import EngineConfig
from lm_eval_toolfid.engine.draft_budget import DraftBudgets
from lm_eval_toolfid.engine.draft_verify import DraftVerifier
from lm_eval_toolfid.engine.handoffs import StageResult
from lm_eval_toolfid.engine.kv_store import KVStore
from lm_eval_toolfid.engine.model_runner import ModelRunner
from lm_eval_toolfid.engine.passes import length_groups, sibling_groups
from lm_eval_toolfid.engine.prefix_cache import PrefixPlan
from lm_eval_toolfid.engine.prompt_pass import Admitted, PrefixPasses, PromptPass, SharedPrefixes
from lm_eval_toolfid.engine.rows import Row


def admission_order(rows: Sequence[Row], todo: list[int], config: EngineConfig) -> tuple[list[int], PrefixPlan | None]:
    """Rows ``todo`` in admission order, and the view's shared-prefix plan (None: no prefixes shared)."""
    plan = None
    if config.share_prefixes and len(todo) > 1:
        views = [r.view for r in rows] if any(r.view is not None for r in rows) else []
        plan = PrefixPlan.build([r.prompt for r in rows], todo, config.min_shared, views)
        if not plan.nodes:
            plan = None
    if plan is not None:  # sorted by prompt: the rows of a shared prefix are admitted together
        return plan.order, plan
    return sorted(todo, key=lambda i: -(len(rows[i].prompt) + len(rows[i].draft))), None


def take_units(waiting: deque[int], rows: Sequence[Row], free: int, joint: bool, force: bool = False) -> list[int]:
    """The waiting rows to admit into ``free`` decode slots, in order, never parting a prompt's rows of several views
    (a joint run: they join the decode batch together and step in lockstep). ``force`` (the batch is empty): at least
    ``free`` rows of a unit larger than that (a prompt asked more often than the batch has slots)."""
    take: list[int] = []
    while waiting:
        unit = 1
        if joint:
            prompt = rows[waiting[0]].prompt
            while unit < len(waiting) and rows[waiting[unit]].prompt == prompt:
                unit += 1
        if len(take) + unit > free:
            if force and not take:
                take = [waiting.popleft() for _ in range(min(free, len(waiting)))]
            break
        take += [waiting.popleft() for _ in range(unit)]
    return take


class Admission:
    """The passes that admit rows: prompt passes (with shared prefixes), then draft verification."""

    def __init__(self, runner: ModelRunner, store: KVStore, config: EngineConfig, near_tie: float,
                 plan: PrefixPlan | None) -> None:
        self.config = config
        self.joint = runner.joint
        self.prefixes = SharedPrefixes(plan)
        self.prefix_passes = PrefixPasses(runner, store, config, self.prefixes)
        self.prompt_pass = PromptPass(runner, store, config, near_tie, self.prefixes)
        self.verifier = DraftVerifier(runner, store, config, near_tie)
        self.budgets = DraftBudgets(config)
        """Whether a view's rows still draft: its first verification passes tallied (draft_budget.py)."""

    def admit(self, rows: Sequence[tuple[int, Row]]) -> StageResult:
        """Prompt passes for ``rows`` (groups of like length; a row whose prompt starts with a shared prefix computes
        only the rest, on the prefix's KV), then draft passes for every row whose first token matched its draft.
        Returns the rows that finished and those that join the decode batch, in that order of passes."""
        budget, share = self.config.prefill_tokens, self.config.max_padding
        prefixes = self.prefixes
        items = [Admitted(i, row, prefixes.node_of(i)) for i, row in rows]
        if prefixes.plan is not None:
            self.prefix_passes.compute({a.node for a in items if a.node is not None})
            # longest suffix first (the order without shared prefixes is longest prompt first already)
            items.sort(key=lambda a: -(len(a.row.prompt) - prefixes.depth(a.node)))
        outcome = StageResult()
        # a prompt's rows of every view (a joint run) go through one pass: the same kernels for each
        sibling = (lambda a: a.row.prompt) if self.joint else (lambda a: a.index)
        for group in sibling_groups(items, lambda a: len(a.row.prompt) - prefixes.depth(a.node), budget, share,
                                    sibling):
            outcome += self.prompt_pass.run(group)
        # drafts in passes of rows of like prompt length, within the padded-token budget: a verification pass
        # reads every row's KV up to its longest prompt (under grouped-query attention, expanded per query head),
        # so one pass for all rows admitted together — sorted by prompt, not by length, when prefixes are
        # shared — made each draft chunk cost the longest row's columns for every row
        drafting = sorted(outcome.drafting, key=lambda d: -len(d.live.row.prompt))
        for part in self.budgets.probe_first(drafting):  # the draft budgets' probe rows before the others
            for group in length_groups(part, lambda d: len(d.live.row.prompt), budget, share):
                outcome += self.budgets.verify_or_decode(group, self.verifier.verify)
        return StageResult(outcome.finished, outcome.joining, (), outcome.shared_tokens)
