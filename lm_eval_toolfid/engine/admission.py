"""Admission: :class:`Admission` runs the passes that bring the rows the scheduler admitted to the decode batch —
their shared prefixes, their prompt passes, then the verification of the drafts whose first token matched — in the
passes and groups the scheduler (:mod:`~lm_eval_toolfid.engine.scheduler`) hands it."""

from __future__ import annotations

from typing import Sequence

from lm_eval_toolfid.engine.config import RunContext
from lm_eval_toolfid.engine.draft_verify import DraftVerifier, decode_without_drafts
from lm_eval_toolfid.engine.handoffs import Admitted, StageResult
from lm_eval_toolfid.engine.kv_store import KVStore
from lm_eval_toolfid.engine.model_runner import ModelRunner
from lm_eval_toolfid.engine.prompt_pass import PrefixPasses, PromptPass, SharedPrefixes
from lm_eval_toolfid.engine.scheduler import Scheduler


class Admission:
    """The passes that admit rows: shared prefixes and prompt passes, then draft verification, as scheduled."""

    def __init__(self, runner: ModelRunner, store: KVStore, context: RunContext, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.prefixes = SharedPrefixes(scheduler.plan)
        self.prefix_passes = PrefixPasses(runner, store, context, self.prefixes)
        self.prompt_pass = PromptPass(runner, store, context, self.prefixes)
        self.verifier = DraftVerifier(runner, store, context)

    def admit(self, admitted: Sequence[Admitted]) -> StageResult:
        """Prompt passes for ``admitted`` (a row whose prompt starts with a shared prefix computes only the rest, on
        the prefix's KV), then draft passes for every row whose first token matched its draft. Returns the rows that
        finished and those that join the decode batch, in that order of passes."""
        scheduler = self.scheduler
        if self.prefixes.store is not None:
            for nodes in scheduler.prefix_passes(admitted, self.prefixes.store):
                self.prefix_passes.run(nodes)
        outcome = StageResult()
        for group in scheduler.prompt_passes(admitted):
            outcome += self.prompt_pass.run(group)
        for drafts in scheduler.draft_passes(outcome.drafting):
            split = scheduler.split_drafts(drafts)
            outcome += decode_without_drafts(split.decode)
            if split.verify:
                outcome += self.verifier.verify(split.verify)
                scheduler.verified(split.verify)
        return StageResult(outcome.finished, outcome.joining, (), outcome.shared_tokens)
