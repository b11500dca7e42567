"""The engine's entry point: :class:`GreedyEngine` runs one view's (or several views') rows to their results, the
loop that hands the scheduler's decisions to the stages (admit, or one decode step), and the public names.

Every token the engine emits is the model's own argmax; a draft (the base's tokens for the same prompt) only
decides how many of them are computed in one parallel forward pass. The map of the stages, what each hands the
next and why the answers are exact: docs/architecture.md ("The engine's stages") and docs/performance.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Callable, Sequence

from lm_eval_toolfid.engine.admission import Admission
from lm_eval_toolfid.engine.config import (NEAR_TIE, NEAR_TIE_BY_DTYPE, EngineConfig, EngineStats, RunContext,
                                           near_tie_for)
from lm_eval_toolfid.engine.decode_batch import DecodeBatch
from lm_eval_toolfid.engine.kv_store import KVStore
from lm_eval_toolfid.engine.model_runner import EngineUnsupported, ModelFit, ModelRunner, engine_unsupported
from lm_eval_toolfid.engine.rows import Row, RowResult, Stopper
from lm_eval_toolfid.engine.scheduler import DraftBudgets, Scheduler

__all__ = ["NEAR_TIE", "NEAR_TIE_BY_DTYPE", "EngineConfig", "EngineStats", "EngineUnsupported", "GreedyEngine", "Row",
           "RowResult", "Stopper", "engine_unsupported", "near_tie_for"]

log = logging.getLogger("lm_eval.toolfid")


class GreedyEngine:
    """Batched greedy decoding of :class:`Row` s on one Hugging Face causal LM (plain or verified)."""

    def __init__(self, model: Any, pad_id: int | None, config: EngineConfig = EngineConfig(),
                 autocast: Callable[[], Any] | None = None) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.config = config
        self.autocast = autocast or contextlib.nullcontext
        why = engine_unsupported(model)
        if why is not None:
            raise EngineUnsupported(why)
        self.fit = ModelFit.of(model)
        self.stats = EngineStats()
        self.runner = ModelRunner(model, self.fit, int(pad_id) if pad_id is not None else 0, self.stats,
                                  config.fold_gqa)
        dtype = next(model.parameters()).dtype
        self.near_tie = config.near_tie if config.near_tie is not None else near_tie_for(dtype)
        self.kv = KVStore(torch, self.runner.device, self.fit.n_layers)
        self.step_probe: Callable[[], Any] = contextlib.nullcontext
        """A context entered around each decode step (:mod:`~lm_eval_toolfid.engine.step_cost` counts a step's
        calls and host time in it)."""
        self.draft_budgets: DraftBudgets | None = None
        """The last run's draft budgets, one per view: first verification passes tallied, and whether (and why)
        drafting stopped (:mod:`~lm_eval_toolfid.engine.scheduler`)."""

    def run(self, rows: Sequence[Row], on_done: Callable[[int, RowResult], None] | None = None) -> list[RowResult]:
        """Generate every row; results in the order of ``rows``. ``on_done(index, result)`` is called as
        each row finishes (for progress displays)."""
        stats = self.stats
        results: list[RowResult | None] = [None] * len(rows)
        for i, row in enumerate(rows):
            if row.max_new <= 0 or not row.prompt:
                results[i] = RowResult(draft_len=len(row.draft), finish="length")
        todo = [i for i in range(len(rows)) if results[i] is None]
        context = RunContext.of(rows, self.config, self.near_tie)
        stats.prompt_tokens_total += sum(len(rows[i].prompt) for i in todo)
        # the adapter rows' LoRA computation for the whole run (a joint run: each row's adapter)
        routing = self.runner.routing(context.views if context.joint else None, stack=self.config.stack_lora)
        with self.torch.inference_mode(), self.autocast(), routing as stacked:
            context = dataclasses.replace(context, stacked=stacked)
            scheduler = Scheduler(rows, todo, context)
            if scheduler.plan is not None:
                stats.prefix_nodes += len(scheduler.plan.nodes)
            self.draft_budgets = scheduler.budgets
            admission = Admission(self.runner, self.kv, context, scheduler)
            batch = DecodeBatch(self.runner, self.kv, context)
            while scheduler.busy(len(batch.rows)):
                take = scheduler.admit(len(batch.rows))
                if take:
                    admitted = admission.admit(take)
                    stats.shared_tokens += admitted.shared_tokens
                    if admitted.joining:
                        batch.join(admitted.joining, waiting=len(scheduler.waiting))
                    finished = list(admitted.finished)
                else:
                    with self.step_probe():
                        finished = batch.step()
                for done in finished:
                    results[done.index] = done.result
                    if on_done is not None:
                        on_done(done.index, done.result)
        held = admission.prefixes.store
        if held is not None:
            stats.prefix_peak_tokens = max(stats.prefix_peak_tokens, held.peak_tokens)
        return [r if r is not None else RowResult() for r in results]
