"""The engine's settings (:class:`EngineConfig`), one run's context (:class:`RunContext`), what one run computed
(:class:`EngineStats`) and the near-tie bound by dtype (:func:`near_tie_for`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

NEAR_TIE = 1e-3
"""Top-two logit gap below which a verified token counts as a near tie, float32 logits (docs/performance.md)."""
NEAR_TIE_BY_DTYPE = {"bfloat16": 0.25, "float16": 0.03}
"""The same bound for half-precision models: their logits carry 8 (bfloat16) or 11 (float16) significant bits,
so at a top logit of 16-32 one unit in the last place is 0.125 (0.0156), and two schedules of one forward pass
(another batch, a shared prefix, a draft pass) differ by such units: every token that differed between schedules
did so at such a gap (figures in docs/performance.md, "Figures behind the engine's constants")."""


def near_tie_for(dtype: Any) -> float:
    """The near-tie bound for a model whose logits come in ``dtype`` (a torch dtype or its name)."""
    return NEAR_TIE_BY_DTYPE.get(str(dtype).removeprefix("torch."), NEAR_TIE)


@dataclass
class EngineStats:
    """What one engine run computed (benchmarks compare it with the hardware's limits)."""

    forward_passes: int = 0
    prompt_tokens: int = 0
    """Tokens of prompt (+ draft) passes, padding excluded."""
    padded_tokens: int = 0
    """Tokens of prompt (+ draft) passes, padding included."""
    logit_rows: int = 0
    """Positions the lm_head ran on."""
    step_rows: list[int] = field(default_factory=list)
    """Rows in each decode step."""
    prompt_tokens_total: int = 0
    """Prompt tokens of every row (what the prompt passes compute without shared prefixes)."""
    shared_tokens: int = 0
    """Prompt tokens not computed: rows started from a shared prefix computed once."""
    prefix_nodes: int = 0
    prefix_peak_tokens: int = 0
    """Most shared-prefix tokens whose KV was held at once."""
    steps_replayed: int = 0
    """Decode steps replayed from a captured CUDA graph (the rest of ``step_rows`` were launched op by op)."""
    graph_captures: int = 0
    """Decode steps captured (one per bucket of rows and allocation of the decode buffers)."""
    capture_seconds: float = 0.0
    """Time the captures took (each: two eager warm-up steps and the recording)."""
    graph_bytes: int = 0
    """GPU memory the captures reserved (the graphs' shared pool)."""


@dataclass(frozen=True)
class EngineConfig:
    max_batch: int = 16
    """Rows decoding at once."""
    prefill_tokens: int = 4096
    """Padded tokens per prompt/verification forward pass (a row longer than this goes alone)."""
    max_padding: float = 0.1
    """Share of a prompt pass's tokens that may be padding (rows of unlike length go to other passes)."""
    first_chunk: int = 16
    """Draft tokens verified in the first pass; the rest follow only if all of those are accepted."""
    near_tie: float | None = None
    """Top-two logit gap below which a token read from another schedule counts as a near tie (None: by the
    model's dtype, :func:`near_tie_for`)."""
    draft_probe_rows: int = 8
    """Rows whose first draft chunk is verified before the draft budget judges whether drafting pays (0: draft
    every row, never stop; :mod:`lm_eval_toolfid.engine.scheduler`)."""
    draft_min_gain: float = 0.4
    """Tokens a first verification pass must gain per draft token it sends, over the run's drafting rows, for
    drafting to go on (what a sent draft token costs, in decode steps); below it, later rows decode instead."""
    verify_logits: int = 64 * 1024 * 1024
    """Logit floats per verification pass after the first (bounds its memory: rows x chunk x vocab)."""
    record_gaps: bool = False
    refill: int = 0
    """Admit waiting rows once this many decode slots are free (0: max_batch // 8, at least 1)."""
    share_prefixes: bool = True
    """Compute prompt prefixes that rows share once per view (:mod:`lm_eval_toolfid.engine.prefix_cache`)."""
    min_shared: int = 16
    """Shortest shared prefix worth a pass of its own."""
    fold_gqa: bool = True
    """CPU: grouped-query attention over the unexpanded KV cache (:mod:`lm_eval_toolfid.engine.attention`)."""
    stack_lora: bool = True
    """Adapter rows' LoRA deltas in one computation per layer for every adapter (:mod:`lm_eval_toolfid.engine.
    lora_batch`); False: PEFT's own forward (its mixed batch in a joint run)."""
    cuda_graphs: bool = False
    """CUDA: capture the decode step once per bucket of live rows and replay it (:mod:`~lm_eval_toolfid.engine.
    step_graphs`); ignored elsewhere. Off until measured faster with equal answers on a GPU (docs/performance.md)."""
    max_graph_rows: int = 512
    """The largest bucket a decode step is captured at (with ``cuda_graphs``, or run at with ``graph_shapes``): a
    step of more live rows runs eagerly at its own size, as without graphs (its launches are spread over many rows;
    a graph for every bucket up to thousands of rows would hold their memory)."""
    graph_shapes: bool = False
    """Run decode steps at a captured step's shapes (rows padded to their bucket, every column of the buffers read)
    without capturing them: what a replay computes, step by step (tests compare it with plain steps on the CPU)."""


@dataclass(frozen=True)
class RunContext:
    """What one engine run's scheduler and stages read: built once by
    :meth:`~lm_eval_toolfid.engine.decoding.GreedyEngine.run` from its rows and handed down, never changed."""

    config: EngineConfig
    """The engine's config for this run (a joint run: ``max_batch`` at least the number of views, so a prompt's rows
    of every view fit the decode batch at once)."""
    near_tie: float
    """Top-two logit gap below which a token read from another schedule counts as a near tie."""
    joint: bool = False
    """Rows carry their view (:attr:`~lm_eval_toolfid.engine.rows.Row.view`): every pass names each row's adapter
    (the base's rows none), so one pass serves every view."""
    views: tuple[str | None, ...] = ()
    """The run's distinct views, in the order its rows first name them (a joint run; None: the base)."""
    stacked: bool = False
    """Adapter rows' LoRA deltas come from the stacked computation (:mod:`~lm_eval_toolfid.engine.lora_batch`), not
    PEFT's forward: such rows' near ties are counted (:attr:`~lm_eval_toolfid.engine.rows.RowResult.lora`)."""

    def stacked_row(self, view: str | None) -> bool:
        """Whether a row of ``view`` gets its LoRA delta from the stacked computation (a joint run: the adapter rows;
        else every row, the run being one adapter's view)."""
        return self.stacked and (view is not None or not self.joint)

    @classmethod
    def of(cls, rows: Sequence[Any], config: EngineConfig, near_tie: float) -> RunContext:
        views = tuple(dict.fromkeys(row.view for row in rows))
        joint = any(view is not None for view in views)
        if joint:  # room for a prompt's rows of every view at once
            config = dataclasses.replace(config, max_batch=max(config.max_batch, len(views)))
        return cls(config=config, near_tie=near_tie, joint=joint, views=views if joint else ())

    @property
    def refill(self) -> int:
        """Free decode slots at which waiting rows are admitted (``config.refill``; 0: ``max_batch // 8``, at least
        1)."""
        return self.config.refill or max(1, self.config.max_batch // 8)
