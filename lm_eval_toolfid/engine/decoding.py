"""One greedy decoding engine for base and adapter views: plain decoding, and verification of a draft.

A view hands :class:`GreedyEngine` its rows (prompt token ids, stop rules, optionally a *draft*: the
tokens the base generated for the same prompt). Every token the engine emits is the model's own
argmax; a draft only decides how many of them are computed in one parallel forward pass:

- **plain** (no draft): the prompt is processed in one forward pass, then one token per decode step;
- **verified** (a draft): the prompt pass is the same (so the first token is always plain decoding's:
  an adapter that departs from the base at once costs nothing extra); if the first token equals the
  draft's, the draft goes through the model in chunks (``first_chunk`` tokens, then the rest, a pass
  each), appended to the prompt's cache; draft token *j* is accepted while the model's argmax before
  it equals it and the row's stop rules have not ended it; at the first difference the argmax is the
  row's next token and the row continues by decode steps from the cache of the accepted prefix. A
  row whose whole answer is accepted up to its stop never decodes;
- **drafting stopped** (:mod:`~lm_eval_toolfid.engine.draft_budget`): verification costs passes that pay only
  where drafts are accepted. The first passes of a run's drafting rows are tallied (draft tokens sent, tokens
  gained: the accepted ones and the one after them); once ``draft_probe_rows`` rows (8), verified before the
  others, have had one and they gained less than ``draft_min_gain`` (0.4) per token sent, every later row whose
  first token matched its draft decodes from its prompt pass instead, exactly as a plain row does
  (:attr:`RowResult.draft_dropped`). Rows already verifying go on; faithful drafts are verified end to end.

The stages, each in its module, and what each hands the next (:mod:`~lm_eval_toolfid.engine.handoffs`):

1. **admit** (:mod:`~lm_eval_toolfid.engine.admission`): :func:`admission_order` sorts the rows (by prompt
   when prefixes are shared, so a prefix's rows come together, else longest first); the loop below
   admits waiting rows whenever ``refill`` decode slots are free, and :class:`Admission` runs their
   passes, returning a :class:`~lm_eval_toolfid.engine.handoffs.StageResult` (rows finished, rows joining the decode batch);
2. **prompt pass** (:mod:`~lm_eval_toolfid.engine.prompt_pass`, passes built by
   :mod:`~lm_eval_toolfid.engine.passes`): shared prefixes (:mod:`~lm_eval_toolfid.engine.prefix_cache`:
   the branch points of the prompts' token trie) are computed once, each on its nearest computed ancestor;
   each group of like length then runs one pass, each row only the rest of its prompt on its prefix's KV,
   and reads the row's first token: the row is finished, ``Joining`` or ``Drafting`` (first token = the
   draft's), with a ``KVRef`` to its KV;
3. **draft verification** (:mod:`~lm_eval_toolfid.engine.draft_verify`): the ``Drafting`` rows, in groups of
   like prompt length, verify their drafts chunk by chunk on one cache; each row comes back finished or
   ``Joining`` — unless the draft budget (:mod:`~lm_eval_toolfid.engine.draft_budget`) has stopped drafting:
   then the rows join the decode batch from their prompt pass;
4. **join the decode batch** (:mod:`~lm_eval_toolfid.engine.decode_batch`): joining rows' KV is copied into
   free slots of preallocated per-layer buffers (slots x heads x columns x dim, right-aligned, left padding,
   explicit mask and positions), reallocated only when they do not fit;
5. **decode step** (the same module): one token for every live row, on views of the live slots, appended in
   place;
6. **stop and release**: every emitted token goes through :func:`~lm_eval_toolfid.engine.acceptance.take_token`
   (near ties counted, the stop rules asked: :mod:`~lm_eval_toolfid.integrations.lm_eval.stopping`); a row that stops leaves
   the batch at once, the last live row taking its slot (one row copied, not the batch), and columns no live
   row uses are no longer read once they are a quarter of those a step reads (nothing copied); waiting rows are
   admitted in its place (continuous batching). A step's inputs (next ids, positions, mask) stay on the model's
   device: the host waits once a step, for the chosen tokens.

**Views together.** A row may name its view (:attr:`Row.view`, a PEFT adapter; None the base): then every pass of
the run names each row's adapter (PEFT's mixed batch, ``adapter_names``; base rows add no delta), so the base and
any number of adapters share their prompt passes, draft passes and decode steps. Shared prefixes stay within a
view (an adapter changes the prompt's KV); a prompt's rows of every view are admitted side by side, so they go
through the same passes (:class:`~lm_eval_toolfid.engine.prefix_cache.PrefixPlan` with ``views``).

Underneath: :mod:`~lm_eval_toolfid.engine.kv_store` (every allocation, copy and release of KV buffers),
:mod:`~lm_eval_toolfid.engine.slot_cache` (the cache classes the model writes into),
:mod:`~lm_eval_toolfid.engine.model_runner` (whether a model fits, :func:`engine_unsupported`; one forward pass,
counted in :class:`EngineStats`; the lm_head runs only where a token is read, ``logits_to_keep``),
:mod:`~lm_eval_toolfid.engine.rows` and :mod:`~lm_eval_toolfid.engine.config` (the public records, re-exported
here). Prompts and drafts go in passes of at most ``prefill_tokens`` padded tokens; at most ``max_batch`` rows
decode at once.

Numerics: a verified token is read from a parallel pass over the draft, a decoded one from a
single-token step; the two differ by floating-point rounding, which can flip an argmax only where
the top two logits nearly tie. Every verified token records its top-two gap; gaps below
``near_tie`` (by the logits' dtype: 0.001 in float32, 0.25 in bfloat16) are counted per row
(:attr:`RowResult.near_ties`) and reported, never hidden. (A model
whose weights amplify rounding — e.g. a LoRA of large random weights — has no reproducible greedy
output at all: ``generate`` itself changes its answer with the batch's shape. Its first token is
still the plain path's; see docs/performance.md.) Tests compare verified against plain decoding,
and plain decoding against ``generate``, token for token.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections import deque
from typing import Any, Callable, Sequence

from lm_eval_toolfid.engine.admission import Admission, admission_order, take_units
from lm_eval_toolfid.engine.config import NEAR_TIE, NEAR_TIE_BY_DTYPE, EngineConfig, EngineStats, near_tie_for
from lm_eval_toolfid.engine.decode_batch import DecodeBatch
from lm_eval_toolfid.engine.draft_budget import DraftBudgets
from lm_eval_toolfid.engine.kv_store import KVStore
from lm_eval_toolfid.engine.model_runner import EngineUnsupported, ModelFit, ModelRunner, engine_unsupported
from lm_eval_toolfid.engine.rows import Row, RowResult, Stopper

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
        self.draft_budgets: DraftBudgets | None = None
        """The last run's draft budgets, one per view: first verification passes tallied, and whether (and why)
        drafting stopped (:mod:`~lm_eval_toolfid.engine.draft_budget`)."""

    def run(self, rows: Sequence[Row], on_done: Callable[[int, RowResult], None] | None = None) -> list[RowResult]:
        """Generate every row; results in the order of ``rows``. ``on_done(index, result)`` is called as
        each row finishes (for progress displays)."""
        config, stats = self.config, self.stats
        results: list[RowResult | None] = [None] * len(rows)
        for i, row in enumerate(rows):
            if row.max_new <= 0 or not row.prompt:
                results[i] = RowResult(draft_len=len(row.draft), finish="length")
        todo = [i for i in range(len(rows)) if results[i] is None]
        self.runner.joint = any(row.view is not None for row in rows)
        stats.prompt_tokens_total += sum(len(rows[i].prompt) for i in todo)
        order, plan = admission_order(rows, todo, config)
        if plan is not None:
            stats.prefix_nodes += len(plan.nodes)
        waiting = deque(order)
        joint = self.runner.joint
        if joint:  # room for a prompt's rows of every view at once
            config = dataclasses.replace(config, max_batch=max(config.max_batch, len({row.view for row in rows})))
        admission = Admission(self.runner, self.kv, config, self.near_tie, plan)
        self.draft_budgets = admission.budgets
        batch = DecodeBatch(self.runner, self.kv, config, self.near_tie)
        refill = config.refill or max(1, config.max_batch // 8)
        with self.torch.inference_mode(), self.autocast(), self.runner.routing(row.view for row in rows):
            while waiting or batch.rows:
                free = config.max_batch - len(batch.rows)
                take = []
                if waiting and (not batch.rows or free >= min(refill, len(waiting))):
                    take = take_units(waiting, rows, free, joint, force=not batch.rows)
                if take:  # admit
                    admitted = admission.admit([(i, rows[i]) for i in take])
                    stats.shared_tokens += admitted.shared_tokens
                    if admitted.joining:
                        batch.join(admitted.joining, waiting=len(waiting))
                    finished = list(admitted.finished)
                else:
                    finished = batch.step()
                for done in finished:
                    results[done.index] = done.result
                    if on_done is not None:
                        on_done(done.index, done.result)
        held = admission.prefixes.store
        if held is not None:
            stats.prefix_peak_tokens = max(stats.prefix_peak_tokens, held.peak_tokens)
        return [r if r is not None else RowResult() for r in results]
