"""A view's generation record: how its tokens were obtained (the ``generation`` block of its provenance).

``ToolfidHFLM`` leaves a :class:`GenerationInfo` on each request (``Instance.toolfid_generation``); the task sums
them with :func:`summarize_generation` into ``configs.<task>.metadata.toolfid.generation``:

- ``engine``: ``toolfid`` (the greedy engine), ``generate`` (transformers' generate, with the
  reason), or ``not recorded`` (another LM class: lm-eval's HFLM, vLLM);
- ``verify`` and ``rows_verified``: whether the view checked the base's answers, and for how many
  cases it had one (less those whose draft was dropped: ``rows_draft_dropped`` below); ``verify_reason``:
  why (:mod:`lm_eval_toolfid.integrations.lm_eval.verify_policy`: verified by default in float32, decoded by default in half
  precision); ``verify_requested``: the ``verify`` setting (``auto`` when not given) (``draft_sources``:
  ``session`` = the base view of the same process, exact token ids; ``reference`` = the stored base reference's
  text, re-tokenized);
- ``tokens`` = one first token per case (read from its prompt pass, in every mode) +
  ``tokens_verified`` (read from passes over the draft: the accepted ones and the token after them)
  + ``tokens_decoded`` (one decode step each); ``tokens_accepted``: draft tokens the adapter's own
  argmax confirmed; ``rows_answered_by_verification``: cases that needed no decode step at all;
- ``rows_draft_dropped``: cases whose first token matched the base's but that were decoded, because the view's
  drafts were being rejected early (:mod:`lm_eval_toolfid.engine.scheduler`; not counted in
  ``rows_verified``); ``drafting_stopped`` (only when drafting stopped): after how many rows, the draft tokens
  their first verification passes sent and the tokens those gained, the ``gain`` that triggered it, the bound
  ``min_gain`` and the ``reason``;
- ``near_tie_tokens`` / ``near_tie_cases``: verified tokens whose top-two logit gap was below
  ``near_tie_tolerance`` (where parallel and step-by-step rounding could pick differently; 0.001 for
  float32 logits, wider for half precision: :data:`~lm_eval_toolfid.engine.decoding.NEAR_TIE_BY_DTYPE`);
- ``prompt_tokens`` / ``prompt_tokens_shared``: the view's prompt tokens, and those not computed because
  the rows' prompts started from a prefix shared with other rows, computed once
  (:mod:`lm_eval_toolfid.engine.prefix_cache`); ``prefix_near_tie_tokens`` / ``prefix_near_tie_cases``:
  tokens of such rows at a near tie (the prefix's KV came from another pass than an unshared prompt's);
- ``decode_batch`` and ``oom_halvings``: the batch that ran, and how often it was halved for memory;
- ``views_together``: the views whose rows were decoded in the same engine run as this view's, each row under
  its own adapter (:mod:`~lm_eval_toolfid.integrations.lm_eval.joint`); absent when the view ran alone;
  ``rows_together``: how many of the view's requests were decoded in such a run (the others ran alone);
  ``joint_near_tie_tokens`` / ``joint_near_tie_cases``: its decoded tokens at a near tie (the view alone goes
  through batches of other shapes, where such a token could round otherwise).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable

from lm_eval_toolfid.engine.decoding import NEAR_TIE


@dataclass(frozen=True)
class GenerationInfo:
    """How one request's answer was obtained: left on the request (``Instance.toolfid_generation``) by
    ``ToolfidHFLM`` and summed per view by :func:`summarize_generation` (the fields are described above)."""

    engine: str
    """``toolfid`` (the greedy engine) or ``generate`` (transformers' generate)."""
    reason: str | None = None
    """Why transformers' generate answered (engine ``generate``)."""
    verify: bool = False
    verify_reason: str | None = None
    verify_requested: bool | None = None
    draft_source: str | None = None
    draft_tokens: int = 0
    tokens: int = 0
    accepted: int = 0
    verified: int = 0
    decoded: int = 0
    near_ties: int = 0
    finish: str | None = None
    prompt_tokens: int = 0
    prompt_tokens_shared: int = 0
    shared_near_ties: int = 0
    near_tie_tolerance: float | None = None
    decode_batch: int = 0
    oom_halvings: int = 0
    draft_dropped: bool = False
    drafting_stopped: dict[str, Any] | None = None
    views_together: tuple[str, ...] = ()
    """The views of the joint engine run that answered it (empty: the view ran alone)."""
    joint_near_ties: int = 0
    views_together_note: str | None = None
    lora_stacked: bool = False
    """Its LoRA delta came from the engine's stacked computation (one per layer for every adapter), not PEFT's."""
    lora_near_ties: int = 0
    step_graphs: dict[str, Any] | None = None
    """The engine run's captured decode steps (:func:`step_graphs_record`; None: none captured)."""


def step_graphs_record(stats: Any) -> dict[str, Any] | None:
    """An engine run's CUDA graphs, from its stats: decode steps replayed of all steps, captures, their seconds and
    the memory they reserved; None when nothing was captured."""
    if not stats.graph_captures:
        return None
    return {"steps_replayed": stats.steps_replayed, "steps": len(stats.step_rows), "captures": stats.graph_captures,
            "capture_seconds": round(stats.capture_seconds, 3), "graph_bytes": stats.graph_bytes}


def summarize_generation(infos: Iterable[Any], verify: bool | None = None, adapter_view: bool = True) -> dict[str, Any]:
    """Sum the per-request records of one view (requests without one are not counted); ``verify``: the
    view's ``verify`` setting (None: not given); ``adapter_view`` False: a base view (it decodes: its
    answers are what adapter views pair with, so the verify decision does not apply to it)."""
    rows = [i for i in infos if isinstance(i, GenerationInfo)]
    out: dict[str, Any] = {"verify": verify is not False, "verify_requested": "auto" if verify is None else verify}
    if not rows:
        out["engine"] = "not recorded"
        return out
    ours = [r for r in rows if r.engine == "toolfid"]
    decided = [r for r in ours if r.verify_reason is not None]
    if not adapter_view:
        if ours:
            out["verify_reason"] = "the base view: decoded (its answers are what adapter views pair with)"
    elif decided:  # the model class decided (one dtype per view: one decision)
        out["verify"] = any(r.verify for r in decided)
        out["verify_reason"] = decided[0].verify_reason
    others = [r for r in rows if r.engine != "toolfid"]
    out["engine"] = "toolfid" if not others else ("generate" if not ours else "mixed")
    out["rows"] = len(rows)
    if others:
        out["generate_rows"] = len(others)
        out["generate_reason"] = next((r.reason for r in others if r.reason), None)
    if ours:
        drafted = [r for r in ours if r.draft_tokens]
        dropped = [r for r in drafted if r.draft_dropped]
        out.update(
            rows_verified=len(drafted) - len(dropped),
            rows_draft_dropped=len(dropped),
            draft_sources=dict(Counter(r.draft_source for r in drafted)),
            rows_answered_by_verification=sum(1 for r in drafted if not r.decoded),
            tokens=sum(r.tokens for r in ours),
            tokens_accepted=sum(r.accepted for r in ours),
            tokens_verified=sum(r.verified for r in drafted),
            tokens_decoded=sum(r.decoded for r in ours),
            near_tie_tolerance=max((r.near_tie_tolerance or NEAR_TIE for r in ours), default=NEAR_TIE),
            near_tie_tokens=sum(r.near_ties for r in drafted),
            near_tie_cases=sum(1 for r in drafted if r.near_ties),
            prompt_tokens=sum(r.prompt_tokens for r in ours),
            prompt_tokens_shared=sum(r.prompt_tokens_shared for r in ours),
            prefix_near_tie_tokens=sum(r.shared_near_ties for r in ours),
            prefix_near_tie_cases=sum(1 for r in ours if r.shared_near_ties),
            decode_batch=max(r.decode_batch for r in ours),
            oom_halvings=max(r.oom_halvings for r in ours),
        )
        together = next((r.views_together for r in ours if r.views_together), None)
        if together:
            out["views_together"] = list(together)
            out["rows_together"] = sum(1 for r in ours if r.views_together)
            out["joint_near_tie_tokens"] = sum(r.joint_near_ties for r in ours)
            out["joint_near_tie_cases"] = sum(1 for r in ours if r.joint_near_ties)
        stacked = [r for r in ours if r.lora_stacked]
        if stacked:  # adapter rows computed otherwise than PEFT's forward: their near ties, shown
            out["rows_lora_stacked"] = len(stacked)
            out["lora_near_tie_tokens"] = sum(r.lora_near_ties for r in stacked)
            out["lora_near_tie_cases"] = sum(1 for r in stacked if r.lora_near_ties)
        note = next((r.views_together_note for r in ours if r.views_together_note), None)
        if note:
            out["views_together_note"] = note
        graphs = next((r.step_graphs for r in ours if r.step_graphs), None)
        if graphs is not None:
            out["step_graphs"] = graphs
        stopped = next((r.drafting_stopped for r in ours if r.drafting_stopped), None)
        if stopped is not None:
            out["drafting_stopped"] = stopped
    return out
