"""A row as the caller gives it (:class:`Row`), what comes back (:class:`RowResult`), and a row while the engine
generates it (:class:`LiveRow`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence


class Stopper(Protocol):
    def push(self, token: int) -> str | None: ...


@dataclass
class Row:
    """One sequence to generate: its prompt, its stop rules and (to verify) the base's tokens."""

    prompt: Sequence[int]
    stopper: Stopper
    max_new: int
    draft: Sequence[int] = ()
    run_on: Stopper | None = None
    """Keep generating after ``stopper`` ends the row, until this one does (EOS, ``until``, the budget): the
    row's answer is ``tokens[:stopped_at]``, the rest shows what generation without the early stop writes
    (``check_stops``). Costs decode steps only: no second prompt pass."""
    view: str | None = None
    """The PEFT adapter this row runs under when views run jointly (rows of several adapters in one batch, each
    row's LoRA delta its own: :mod:`~lm_eval_toolfid.engine.lora_batch`, or PEFT's mixed-batch ``adapter_names``);
    None: the base (no delta). When no row of a run names one, every row runs on the model as it is (the adapter
    active, or disabled, by the caller)."""


@dataclass
class RowResult:
    """What one row generated, and how each token was obtained."""

    tokens: list[int] = field(default_factory=list)
    finish: str = ""
    """``eos``, ``stop`` (stop string or end of call), ``length``."""
    stopped_at: int | None = None
    """Where the row's stopper ended it; with :attr:`Row.run_on` the tokens after it are the run-on."""
    run_on_finish: str = ""
    """With :attr:`Row.run_on`: why the run-on ended."""
    draft_len: int = 0
    accepted: int = 0
    """Draft tokens accepted by verification (a prefix of the draft)."""
    verified: int = 0
    """Tokens read from a draft pass: the accepted ones after the first, and the token after them (the
    first token always comes from the prompt pass, as in plain decoding)."""
    draft_dropped: bool = False
    """The row's first token matched its draft, but drafting had stopped (the draft budget,
    :mod:`lm_eval_toolfid.engine.scheduler`): it was decoded from its prompt pass as plain decoding does."""
    near_ties: int = 0
    """Verified tokens whose top-two logit gap was below the engine's ``near_tie``."""
    shared: int = 0
    """Prompt tokens this row did not compute: its prompt started from a shared prefix's KV."""
    shared_near_ties: int = 0
    """Tokens of a row on a shared prefix (not verified ones) whose top-two gap was below ``near_tie``: the
    prefix's KV came from another pass than plain decoding's, so such a token could be picked otherwise."""
    joint: bool = False
    """The row was generated with other views' rows in its batches (a joint run)."""
    joint_near_ties: int = 0
    """Tokens of a joint run's row (not verified ones) whose top-two gap was below ``near_tie``: the view alone goes
    through batches of other shapes, where such a token could be picked otherwise (float32: never seen)."""
    lora: bool = False
    """The row's LoRA delta came from the engine's stacked computation (:mod:`~lm_eval_toolfid.engine.lora_batch`),
    not PEFT's own forward, which may round it otherwise in the last bit."""
    lora_near_ties: int = 0
    """Tokens of a :attr:`lora` row (not verified ones) whose top-two gap was below ``near_tie``: PEFT's forward (what
    ``lm_eval --model hf ... peft=`` runs) could pick such a token otherwise."""
    gaps: list[float] = field(default_factory=list)
    """Top-two logit gap of every emitted token (only with ``record_gaps``)."""
    deferred: int = 0
    """The last tokens taken from a draft whose stop decisions were read from the draft's shared walk
    (:func:`~lm_eval_toolfid.engine.acceptance.accept_predictions`), not yet pushed into the row's stopper: pushed
    before the stopper is asked anything else (a row that diverges and decodes on)."""

    @property
    def answer(self) -> list[int]:
        """The row's tokens up to where its stopper ended it (all of them without a run-on)."""
        return self.tokens if self.stopped_at is None else self.tokens[:self.stopped_at]

    @property
    def decoded(self) -> int:
        """Tokens computed by decode steps (the first token comes from the prompt pass; verified ones
        from draft passes)."""
        return max(0, len(self.tokens) - 1 - self.verified)


@dataclass
class LiveRow:
    """A row being generated: its index in the run, its result so far and where its cache stands."""

    index: int
    row: Row
    result: RowResult
    length: int = 0
    """Valid cache columns (prompt + tokens already fed)."""
    pending: int = -1
    """The token to feed next (already emitted)."""
