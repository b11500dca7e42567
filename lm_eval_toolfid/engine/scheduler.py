"""The engine's scheduler: every decision of what one run computes next, and in which passes; the stages execute
what it hands them (docs/architecture.md, "The engine's stages").

- **Admission** (:meth:`Scheduler.admit`): rows are admitted in one order for the run (:func:`admission_order`: by
  prompt when prefixes are shared, so a prefix's rows come together; else longest prompt and draft first), whenever
  ``refill`` decode slots are free (or the batch is empty), in units that never part a prompt's rows of several
  views (:func:`take_units`).
- **Passes**: the shared prefixes admitted rows start from, in waves whose parents are computed
  (:meth:`Scheduler.prefix_passes`); prompt passes (:meth:`Scheduler.prompt_passes`) and draft verification passes
  (:meth:`Scheduler.draft_passes`) in groups of like length within the padded-token budget
  (:func:`length_groups`), a prompt's rows of every view in the same pass (:func:`sibling_groups`).
- **Drafting** (:class:`DraftBudget`, one per view): verification never changes a token, only what computing them
  costs. A row's first verification pass sends its first ``first_chunk`` draft tokens through the model in one
  forward pass and *gains* the tokens it emits there (the draft tokens accepted and the model's own token after
  them), each one decode step the row no longer needs; a sent draft token costs about ``draft_min_gain`` decode
  steps. So the first passes of a view's drafting rows are tallied (draft tokens sent, tokens gained); its first
  ``draft_probe_rows`` rows are verified before the others (:meth:`DraftBudgets.probe_first`); once they are in, and
  after every verification pass from then on, if the view's first passes gained less than ``draft_min_gain`` per
  token sent, drafting stops for the rest of the run: every later row whose first token matched its draft joins the
  decode batch from its prompt pass, as plain decoding's rows do (:meth:`Scheduler.split_drafts`;
  :attr:`~lm_eval_toolfid.engine.rows.RowResult.draft_dropped` says so). Rows whose verification has begun finish
  it. A row whose first token differs from its draft's never drafts and is no evidence either way. The rule reads
  token counts, never clocks: the same view drafts the same rows on any machine.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Container, Iterable, Iterator, Sequence, TypeVar

from lm_eval_toolfid.engine.config import EngineConfig, RunContext
from lm_eval_toolfid.engine.handoffs import Admitted, Drafting, DraftSplit
from lm_eval_toolfid.engine.prefix_cache import PrefixPlan, prefix_key
from lm_eval_toolfid.engine.rows import Row

T = TypeVar("T")


class Scheduler:
    """One engine run's decisions: which waiting rows are admitted and when, the passes that bring them to the
    decode batch, and which drafts are verified (:class:`DraftBudgets`)."""

    def __init__(self, rows: Sequence[Row], todo: list[int], context: RunContext) -> None:
        self.rows, self.context = rows, context
        order, self.plan = admission_order(rows, todo, context.config)
        self.waiting: deque[int] = deque(order)
        """Rows not yet admitted, in admission order."""
        self.budgets = DraftBudgets(context.config)
        """Whether a view's rows still draft: its first verification passes tallied."""

    def busy(self, live: int) -> bool:
        """Rows are waiting, or ``live`` rows are decoding."""
        return bool(self.waiting) or live > 0

    def admit(self, live: int) -> list[Admitted]:
        """The rows to admit now, with ``live`` rows decoding (empty: run a decode step instead). Waiting rows are
        admitted once ``refill`` decode slots are free (all of them when fewer wait), or whenever the batch is
        empty."""
        free = self.context.config.max_batch - live
        if not self.waiting or (live and free < min(self.context.refill, len(self.waiting))):
            return []
        take = take_units(self.waiting, self.rows, free, self.context.joint, force=not live)
        row_node = self.plan.row_node if self.plan is not None else None
        return [Admitted(i, self.rows[i], row_node[i] if row_node is not None else None) for i in take]

    def prefix_passes(self, admitted: Sequence[Admitted], held: Container[int]) -> list[list[int]]:
        """The shared-prefix nodes the admitted rows start from and their ancestors not ``held`` yet, in passes:
        each wave the nodes whose parent is computed, longest own span first (a prefix's nodes of every view
        together), grouped as prompt passes are."""
        plan = self.plan
        if plan is None:
            return []
        todo: list[int] = []
        for node in sorted({a.node for a in admitted if a.node is not None}):  # the node, its ancestors not held
            chain: list[int] = []
            while node is not None and node not in held:
                chain.append(node)
                node = plan.nodes[node].parent
            todo += chain[::-1]
        todo = list(dict.fromkeys(todo))
        own = lambda n: plan.nodes[n].depth - plan.depth(plan.nodes[n].parent)  # noqa: E731
        # a prefix's nodes of every view (a joint run) go through one pass: the same kernels for each
        sibling = (lambda n: (plan.nodes[n].depth, prefix_key(plan.prompts[plan.nodes[n].row], plan.nodes[n].depth))
                   ) if plan.views else (lambda n: n)
        config, passes, done = self.context.config, [], set()
        while todo:
            ready = [n for n in todo if plan.nodes[n].parent is None or plan.nodes[n].parent in held
                     or plan.nodes[n].parent in done]
            ready.sort(key=lambda n: (-own(n), sibling(n)) if plan.views else -own(n))
            passes += sibling_groups(ready, own, config.prefill_tokens, config.max_padding, sibling)
            done.update(ready)
            todo = [n for n in todo if n not in done]
        return passes

    def prompt_passes(self, admitted: Sequence[Admitted]) -> list[list[Admitted]]:
        """The admitted rows' prompt passes: groups of like length (of the prompt after the row's shared prefix,
        longest first), a prompt's rows of every view (a joint run) in one pass."""
        plan, config = self.plan, self.context.config
        rest = lambda a: len(a.row.prompt) - (plan.depth(a.node) if plan is not None else 0)  # noqa: E731
        items = list(admitted)
        if plan is not None:  # longest suffix first (without shared prefixes the order is longest prompt first)
            items.sort(key=lambda a: -rest(a))
        sibling = (lambda a: a.row.prompt) if self.context.joint else (lambda a: a.index)
        return list(sibling_groups(items, rest, config.prefill_tokens, config.max_padding, sibling))

    def draft_passes(self, drafting: Sequence[Drafting]) -> list[list[Drafting]]:
        """Rows whose first token matched their draft, in verification passes: each view's probe rows first
        (:meth:`DraftBudgets.probe_first`), then the rest; each part in groups of like prompt length, longest
        first, within the padded-token budget. (A verification pass reads every row's KV up to its longest prompt,
        so rows admitted together — sorted by prompt, not by length, when prefixes are shared — go to passes of
        like length.)"""
        config = self.context.config
        drafting = sorted(drafting, key=lambda d: -len(d.live.row.prompt))
        return [group for part in self.budgets.probe_first(drafting)
                for group in length_groups(part, lambda d: len(d.live.row.prompt), config.prefill_tokens,
                                           config.max_padding)]

    def split_drafts(self, group: Sequence[Drafting]) -> DraftSplit:
        """A verification pass's rows: those whose view still drafts are verified, the others join the decode batch
        from their prompt pass (counted as dropped)."""
        return self.budgets.split(group)

    def verified(self, group: Sequence[Drafting]) -> None:
        """A verification pass ran: its rows' first passes are tallied (drafting may stop)."""
        self.budgets.observe(group)


def admission_order(rows: Sequence[Row], todo: list[int], config: EngineConfig) -> tuple[list[int], PrefixPlan | None]:
    """Rows ``todo`` in admission order, and the run's shared-prefix plan (None: no prefixes shared)."""
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


def length_groups(items: Sequence[T], length: Callable[[T], int], budget: int, share: float,
                  rows: Callable[[T], int] | None = None) -> Iterator[list[T]]:
    """Consecutive items (longest first) per pass: at most ``budget`` padded tokens, and at most ``share`` of them
    padding; ``rows``: the rows an item stands for (default 1; a unit of sibling rows goes whole)."""
    group: list[T] = []
    longest = real = count = 0
    for item in items:  # already longest first
        n, k = length(item), rows(item) if rows is not None else 1
        top = max(longest, n)
        padded = top * (count + k)
        if group and (padded > budget or padded - real - n * k > share * padded):
            yield group
            group, longest, real, count, top = [], 0, 0, 0, n
        group.append(item)
        longest, real, count = top, real + n * k, count + k
    if group:
        yield group


def sibling_groups(items: Sequence[T], length: Callable[[T], int], budget: int, share: float,
                   sibling: Callable[[T], Any]) -> Iterator[list[T]]:
    """:func:`length_groups` that never parts siblings: consecutive items of equal ``sibling`` key (a prompt's rows of
    every view in a joint run) go through the same pass, so they are computed by the same kernels."""
    units: list[list[T]] = []
    for item in items:
        if units and sibling(units[-1][0]) == sibling(item):
            units[-1].append(item)
        else:
            units.append([item])
    for group in length_groups(units, lambda u: length(u[0]), budget, share, rows=len):
        yield [item for unit in group for item in unit]


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
    """Tallies a view's first verification passes and says whether its rows still draft (module docstring: the
    rule)."""

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

    def observe(self, group: Iterable[Drafting]) -> None:
        """Tally the first passes of rows the verification stage just verified (their results hold every token the
        verification emitted)."""
        for d in group:
            self.record(*self.first_pass(len(d.live.row.draft), d.live.result.verified))


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

    def split(self, group: Sequence[Drafting]) -> DraftSplit:
        """The group's rows whose view still drafts (to verify), and the others (to decode from their prompt pass,
        counted in their budget's ``dropped``)."""
        verify = tuple(d for d in group if self.of(d.live.row).drafting)
        decode = tuple(d for d in group if not self.of(d.live.row).drafting)
        for d in decode:
            self.of(d.live.row).dropped += 1
        return DraftSplit(verify=verify, decode=decode)

    def observe(self, group: Iterable[Drafting]) -> None:
        """Tally each verified row's first pass in its view's budget."""
        for d in group:
            self.of(d.live.row).observe([d])

    def stopped(self, view: Any = None) -> dict[str, Any] | None:
        """Why and when the view's drafting stopped, for its record (None: it never stopped)."""
        budget = self.by_view.get(view)
        return budget.stop.as_record() if budget is not None and budget.stop is not None else None


def drafting_stopped(engine: Any, view: Any = None) -> dict[str, Any] | None:
    """A :class:`~lm_eval_toolfid.engine.decoding.GreedyEngine`'s last run: why and when the view's drafting stopped,
    for its record (None: it never stopped, or the engine ran no rows)."""
    budgets = getattr(engine, "draft_budgets", None)
    return budgets.stopped(view) if budgets is not None else None
