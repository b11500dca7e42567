"""What the scheduler and the engine's stages hand each other: a row the scheduler admitted (:class:`Admitted`), a
row's state after a pass (:class:`RowState`), a row that goes on to draft verification (:class:`Drafting`) or joins
the decode batch (:class:`Joining`), what a stage returns (:class:`StageResult`), and a verification pass's rows as
the scheduler splits them (:class:`DraftSplit`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

from lm_eval_toolfid.engine.kv_store import KVRef
from lm_eval_toolfid.engine.rows import LiveRow, Row


@dataclass(frozen=True)
class Admitted:
    """A row admitted to its prompt pass: its index in the run, and the shared prefix it starts from (a node of
    the run's :class:`~lm_eval_toolfid.engine.prefix_cache.PrefixPlan`; None: from the start)."""

    index: int
    row: Row
    node: int | None = None


class RowState(enum.Enum):
    """Where a row stands after the predictions of one pass."""

    DONE = "done"
    """The row stopped: its result is final."""
    VERIFY = "verify"
    """Every draft token so far accepted, and the draft goes on beyond this pass: its next chunk is verified."""
    DECODE = "decode"
    """The row continues by decode steps from its ``pending`` token."""


@dataclass(frozen=True)
class Drafting:
    """A row whose first token matched its draft: the rest of the draft is verified on its prompt's KV."""

    live: LiveRow
    kv: KVRef


@dataclass(frozen=True)
class Joining:
    """A row that goes on by decode steps: its KV (``live.length`` columns) joins the decode batch."""

    live: LiveRow
    kv: KVRef


@dataclass(frozen=True)
class StageResult:
    """What a stage produced: rows that finished, rows that join the decode batch, rows whose drafts go on
    (in the order the stage met them), and prompt tokens taken from shared prefixes instead of computed."""

    finished: tuple[LiveRow, ...] = ()
    joining: tuple[Joining, ...] = ()
    drafting: tuple[Drafting, ...] = ()
    shared_tokens: int = 0

    def __add__(self, other: StageResult) -> StageResult:
        return StageResult(self.finished + other.finished, self.joining + other.joining, self.drafting + other.drafting,
                       self.shared_tokens + other.shared_tokens)

    @staticmethod
    def of(states: Sequence[tuple[RowState, LiveRow, KVRef]], shared_tokens: int = 0) -> StageResult:
        """Rows sorted by their state after a pass, each with where its KV is."""
        return StageResult(finished=tuple(live for state, live, _ in states if state is RowState.DONE),
                       joining=tuple(Joining(live, kv) for state, live, kv in states if state is RowState.DECODE),
                       drafting=tuple(Drafting(live, kv) for state, live, kv in states if state is RowState.VERIFY),
                       shared_tokens=shared_tokens)


@dataclass(frozen=True)
class DraftSplit:
    """A verification pass's rows as the scheduler splits them: those whose view still drafts, verified; the others
    (drafting stopped for their view) join the decode batch from their prompt pass."""

    verify: tuple[Drafting, ...] = ()
    decode: tuple[Drafting, ...] = ()
