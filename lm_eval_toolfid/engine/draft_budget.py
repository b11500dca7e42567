"""The draft budget: where a view's drafts are rejected early, the engine stops drafting and decodes.

Verification never changes a token (every token is the model's own argmax), only what computing them costs. A row's
first verification pass sends its first ``first_chunk`` draft tokens through the model in one forward pass and
*gains* the tokens it emits there: the draft tokens accepted and the model's own token after them, each one decode
step the row no longer needs. The pass costs about ``draft_min_gain`` decode steps per draft token sent (a token of
a parallel pass is cheaper than a decode step's, but rejected ones are computed for nothing). So drafting pays
while the view's first passes gain at least ``draft_min_gain`` tokens per draft token sent.

The rule (:class:`DraftBudget`; one per view of an engine run, :class:`DraftBudgets`): the first passes of the
view's drafting rows are tallied (draft tokens sent, tokens gained). The first ``draft_probe_rows`` of them are
verified before the others; once they are in, and after every verification pass from then on, if the view's first
passes gained less than ``draft_min_gain`` per token sent, drafting stops for the rest of the run: every later row
whose first token matched its draft goes to the decode batch from its prompt pass, exactly as plain decoding's rows
do (:func:`decode_without_drafts`; :attr:`~lm_eval_toolfid.engine.rows.RowResult.draft_dropped` says so). Rows
whose verification has begun finish it. A row whose first token differs from its draft's never drafts (that token
comes from the prompt pass, which plain decoding runs too) and costs nothing, so it is no evidence either way. The
rule reads token counts, never clocks: the same view drafts the same rows on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from lm_eval_toolfid.engine.config import EngineConfig
from lm_eval_toolfid.engine.handoffs import Drafting, Joining, StageResult
from lm_eval_toolfid.engine.rows import Row


@dataclass(frozen=True)
class DraftStop:
    """Why and when a run stopped drafting: the tallies that triggered it."""

    after_rows: int
    """Rows whose first draft chunk had been verified."""
    sent: int
    """Draft tokens those first passes sent."""
    gained: int
    """Tokens they emitted (accepted draft tokens and the model's token after them)."""
    min_gain: float

    @property
    def gain(self) -> float:
        return self.gained / self.sent if self.sent else 0.0

    def reason(self) -> str:
        return (f"drafts were rejected early (first verification passes gained {self.gain:.0%} of the draft tokens "
                f"they sent; drafting pays from {self.min_gain:.0%})")

    def as_record(self) -> dict[str, Any]:
        return {"after_rows": self.after_rows, "draft_tokens_sent": self.sent, "tokens_gained": self.gained,
                "gain": round(self.gain, 4), "min_gain": self.min_gain, "reason": self.reason()}


class DraftBudget:
    """Tallies a run's first verification passes and says whether rows still draft (module docstring: the rule)."""

    def __init__(self, probe_rows: int, min_gain: float, first_chunk: int) -> None:
        self.probe_rows, self.min_gain, self.first_chunk = probe_rows, min_gain, max(1, first_chunk)
        self.rows = self.sent = self.gained = 0
        self.stop: DraftStop | None = None
        self.dropped = 0
        """Rows that went without their drafts."""

    @classmethod
    def of(cls, config: EngineConfig) -> DraftBudget:
        return cls(config.draft_probe_rows, config.draft_min_gain, config.first_chunk)

    @property
    def drafting(self) -> bool:
        return self.stop is None

    @property
    def probe_need(self) -> int:
        """Drafting rows the budget still needs before it judges (0: it judges after every pass, or it stopped)."""
        return max(0, self.probe_rows - self.rows) if self.drafting and self.probe_rows > 0 else 0

    def record(self, sent: int, gained: int) -> None:
        """One row's first verification pass: ``sent`` draft tokens, ``gained`` tokens emitted. Judges the run's
        tallies once ``probe_rows`` rows are in."""
        self.rows += 1
        self.sent += sent
        self.gained += gained
        if (self.stop is None and self.probe_rows > 0 and self.rows >= self.probe_rows
                and self.gained < self.min_gain * self.sent):
            self.stop = DraftStop(self.rows, self.sent, self.gained, self.min_gain)

    def first_pass(self, draft_len: int, verified: int) -> tuple[int, int]:
        """A verified row's first pass from its result: (draft tokens sent, tokens gained). The first pass sends
        ``min(draft_len, first_chunk)`` tokens (draft_verify.py); a row verified further had all of them accepted."""
        sent = min(draft_len, self.first_chunk)
        return sent, min(verified, sent)

    def observe(self, group: Sequence[Drafting]) -> None:
        """Tally the first passes of a group :class:`~lm_eval_toolfid.engine.draft_verify.DraftVerifier` just
        verified (their results hold every token the verification emitted)."""
        for d in group:
            res = d.live.result
            self.record(*self.first_pass(len(d.live.row.draft), res.verified))

    def without_drafts(self, group: Sequence[Drafting]) -> StageResult:
        """The group's rows decode instead (drafting has stopped): :func:`decode_without_drafts`, counted."""
        self.dropped += len(group)
        return decode_without_drafts(group)


def view_of(row: Row) -> Any:
    """The view a row belongs to: its ``view`` (an adapter's name, where several views decode in one run), else
    None (the run is one view)."""
    return getattr(row, "view", None)


class DraftBudgets:
    """A run's draft budgets, one per view (:func:`view_of`): one adapter's rejected drafts never stop another's."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.by_view: dict[Any, DraftBudget] = {}

    def of(self, row: Row) -> DraftBudget:
        view = view_of(row)
        if view not in self.by_view:
            self.by_view[view] = DraftBudget.of(self.config)
        return self.by_view[view]

    def probe_first(self, rows: Sequence[Drafting]) -> list[list[Drafting]]:
        """Drafting rows (in order) in the parts their passes go in: while a view's budget has not judged, the rows
        it still needs (its first ones) go first, without the others, so that it judges before they are verified."""
        need: dict[int, int] = {}
        probe, rest = [], []
        for d in rows:
            budget = self.of(d.live.row)
            left = need.setdefault(id(budget), budget.probe_need)
            if left > 0:
                probe.append(d)
                need[id(budget)] = left - 1
            else:
                rest.append(d)
        return [part for part in (probe, rest) if part]

    def verify_or_decode(self, group: Sequence[Drafting], verify: Callable[[Sequence[Drafting]], StageResult]) -> StageResult:
        """The group's rows whose view still drafts verified (``verify``: the verification stage) and their first
        passes tallied; the others decoded from their prompt passes (:meth:`DraftBudget.without_drafts`)."""
        going = [d for d in group if self.of(d.live.row).drafting]
        outcome = StageResult()
        for d in group:
            if not self.of(d.live.row).drafting:
                outcome += self.of(d.live.row).without_drafts([d])
        if going:
            outcome += verify(going)
            for d in going:
                self.of(d.live.row).observe([d])
        return outcome

    def stopped(self, view: Any = None) -> dict[str, Any] | None:
        """Why and when the view's drafting stopped, for its record (None: it never stopped)."""
        budget = self.by_view.get(view)
        return budget.stop.as_record() if budget is not None and budget.stop is not None else None


def drafting_stopped(engine: Any, view: Any = None) -> dict[str, Any] | None:
    """A :class:`~lm_eval_toolfid.engine.decoding.GreedyEngine`'s last run: why and when the view's drafting stopped,
    for its record (None: it never stopped, or the engine ran no rows)."""
    budgets = getattr(engine, "draft_budgets", None)
    return budgets.stopped(view) if budgets is not None else None


def decode_without_drafts(group: Sequence[Drafting]) -> StageResult:
    """Rows whose first token matched their draft, sent to the decode batch instead of verified: from the KV and
    first token of their prompt pass, as plain decoding's rows join it, so their tokens are plain decoding's."""
    joining = []
    for d in group:
        live = d.live
        live.result.draft_dropped = True
        live.pending = live.result.tokens[-1]
        live.length = len(live.row.prompt)
        joining.append(Joining(live, d.kv))
    return StageResult(joining=tuple(joining))
