"""The draft budget's rule (engine/scheduler.py, issue 37): where a view's drafts are rejected early, the engine
stops drafting and decodes. Unit tests of the rule and of what it records; the engine and ``toolfid run`` with it:
tests/test_engine.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lm_eval_toolfid.engine.config import EngineConfig
from lm_eval_toolfid.engine.draft_verify import decode_without_drafts
from lm_eval_toolfid.engine.handoffs import Drafting, StageResult
from lm_eval_toolfid.engine.scheduler import DraftBudget, DraftBudgets, drafting_stopped
from lm_eval_toolfid.engine.rows import LiveRow, Row, RowResult


def test_defaults_come_from_the_engine_config() -> None:
    budget = DraftBudget.of(EngineConfig())
    assert (budget.probe_rows, budget.min_gain, budget.first_chunk) == (8, 0.4, 16)
    assert budget.drafting and budget.stop is None


def test_no_judgement_before_enough_rows() -> None:
    budget = DraftBudget(probe_rows=4, min_gain=0.4, first_chunk=16)
    for _ in range(3):
        budget.record(16, 1)  # rejected at once
    assert budget.drafting
    budget.record(16, 1)
    assert not budget.drafting
    stop = budget.stop
    assert (stop.after_rows, stop.sent, stop.gained) == (4, 64, 4) and stop.gain == pytest.approx(1 / 16)
    assert "rejected early" in stop.reason() and "6%" in stop.reason() and "40%" in stop.reason()


@pytest.mark.parametrize("gained, drafting", [(16, True), (7, True), (6, False), (1, False)])
def test_drafting_goes_on_while_first_passes_gain_enough(gained: int, drafting: bool) -> None:
    """The bound is per draft token sent: 0.4 x 16 = 6.4 tokens a first pass."""
    budget = DraftBudget(probe_rows=8, min_gain=0.4, first_chunk=16)
    for _ in range(20):
        budget.record(16, gained)
    assert budget.drafting is drafting
    if not drafting:
        assert budget.stop.after_rows == 8  # judged as soon as the probe was in


def test_the_rule_is_cumulative_and_a_stop_is_final() -> None:
    budget = DraftBudget(probe_rows=2, min_gain=0.5, first_chunk=16)
    budget.record(16, 16)
    budget.record(16, 16)
    assert budget.drafting
    for _ in range(3):
        budget.record(16, 0)  # 32 of 80: 0.4 < 0.5
    assert not budget.drafting and budget.stop.after_rows == 5
    budget.record(16, 16)
    assert not budget.drafting and budget.stop.after_rows == 5


def test_zero_probe_rows_never_stops() -> None:
    budget = DraftBudget(probe_rows=0, min_gain=0.4, first_chunk=16)
    for _ in range(100):
        budget.record(16, 0)
    assert budget.drafting and budget.probe_need == 0


@pytest.mark.parametrize("draft_len, verified, expected", [
    (40, 3, (16, 3)),    # rejected inside the first chunk
    (40, 30, (16, 16)),  # the first chunk accepted whole, then a second one
    (5, 5, (5, 5)),      # a short draft accepted to its end
    (1, 1, (1, 1)),      # a draft of only the first token: one token after it
])
def test_a_rows_first_pass_from_its_result(draft_len: int, verified: int, expected: tuple) -> None:
    assert DraftBudget(8, 0.4, 16).first_pass(draft_len, verified) == expected


def _drafting(prompt: list[int], draft: list[int], first: int, view: str | None = None) -> Drafting:
    row = Row(prompt=prompt, stopper=SimpleNamespace(push=lambda t: None), max_new=8, draft=draft)
    if view is not None:
        row.view = view  # type: ignore[attr-defined]  # a view's adapter name (several views in one run)
    live = LiveRow(index=0, row=row, result=RowResult(tokens=[first], draft_len=len(draft), accepted=1))
    return Drafting(live, kv=SimpleNamespace())  # type: ignore[arg-type]


def test_the_probe_rows_go_first_alone() -> None:
    budgets = DraftBudgets(EngineConfig(draft_probe_rows=3))
    rows = [_drafting([1], [5, 6], 5) for _ in range(10)]
    assert budgets.probe_first(rows) == [rows[:3], rows[3:]]
    budgets.of(rows[0].live.row).record(16, 16)
    assert budgets.probe_first(rows) == [rows[:2], rows[2:]]
    assert budgets.probe_first(rows[:2]) == [rows[:2]]
    budgets.of(rows[0].live.row).record(16, 16)
    budgets.of(rows[0].live.row).record(16, 16)
    assert budgets.probe_first(rows) == [rows] and budgets.probe_first([]) == []


def test_each_view_has_its_own_budget() -> None:
    """Rows of several views in one run (``Row.view``: an adapter's name): one adapter's rejected drafts stop its own
    drafting only; each view probes its own first rows."""
    budgets = DraftBudgets(EngineConfig(draft_probe_rows=2))
    bad = [_drafting([1], [5] * 20, 5, view="bad") for _ in range(4)]
    good = [_drafting([1], [5] * 20, 5, view="good") for _ in range(4)]
    mixed = [bad[0], good[0], bad[1], bad[2], good[1], good[2], bad[3], good[3]]
    assert budgets.probe_first(mixed) == [[bad[0], good[0], bad[1], good[1]], [bad[2], good[2], bad[3], good[3]]]
    verified: list = []

    def verify(group):  # the verification stage: bad rows gain 1 token of 16, good ones 16
        verified.extend(group)
        for d in group:
            d.live.result.verified = 1 if d.live.row.view == "bad" else 16
        return StageResult()

    def verify_or_decode(group):  # as engine/admission.py runs a verification pass the scheduler split
        split = budgets.split(group)
        out = decode_without_drafts(split.decode)
        if split.verify:
            out += verify(split.verify)
            budgets.observe(split.verify)
        return out

    verify_or_decode([bad[0], good[0], bad[1], good[1]])
    assert not budgets.of(bad[0].live.row).drafting and budgets.of(good[0].live.row).drafting
    out = verify_or_decode([bad[2], good[2], bad[3], good[3]])
    assert verified == [bad[0], good[0], bad[1], good[1], good[2], good[3]]
    assert [j.live for j in out.joining] == [bad[2].live, bad[3].live]
    assert budgets.stopped("bad")["after_rows"] == 2 and budgets.stopped("good") is None
    assert budgets.stopped() is None and budgets.of(bad[0].live.row).dropped == 2


def test_observe_tallies_the_groups_first_passes_and_dropped_rows_join_as_plain_rows_do() -> None:
    budget = DraftBudget(probe_rows=2, min_gain=0.4, first_chunk=4)
    a, b = _drafting([1, 2, 3], [7, 8, 9, 10, 11], 7), _drafting([1, 2], [7, 8], 7)
    a.live.result.verified, b.live.result.verified = 1, 2
    budget.observe([a, b])
    assert (budget.rows, budget.sent, budget.gained) == (2, 6, 3) and budget.drafting
    c = _drafting([4, 5, 6, 7], [9, 9, 9], 9)
    out = decode_without_drafts([c])
    assert out.finished == () and out.drafting == ()
    (joining,) = out.joining
    live = joining.live
    assert live.result.draft_dropped and live.pending == 9 and live.length == 4 and joining.kv is c.kv
    assert live.result.verified == 0 and live.result.accepted == 1
    assert decode_without_drafts([]).joining == ()


def test_the_stop_reaches_the_views_record_and_the_run_header() -> None:
    from dataclasses import replace

    from lm_eval_toolfid.integrations.lm_eval.generation_record import GenerationInfo, summarize_generation
    from lm_eval_toolfid.reporting.screen import drafting_note, generation_paths

    budget = DraftBudget(probe_rows=2, min_gain=0.4, first_chunk=16)
    budget.record(16, 1)
    budget.record(16, 2)
    budgets = DraftBudgets(EngineConfig())
    budgets.by_view[None] = budget
    stop = drafting_stopped(SimpleNamespace(draft_budgets=budgets))
    assert stop == {"after_rows": 2, "draft_tokens_sent": 32, "tokens_gained": 3, "gain": 0.0938, "min_gain": 0.4,
                    "reason": budget.stop.reason()}
    assert drafting_stopped(SimpleNamespace(draft_budgets=DraftBudgets(EngineConfig()))) is None
    assert drafting_stopped(SimpleNamespace(draft_budgets=None)) is None and drafting_stopped(object()) is None
    reason = "verified against the base's answers: exact in float32"
    row = GenerationInfo(engine="toolfid", verify=True, verify_reason=reason, draft_tokens=9, tokens=9,
                         drafting_stopped=stop)
    infos = [replace(row, verified=2, accepted=2, decoded=6)] * 2 + [replace(row, decoded=8, draft_dropped=True)] * 3
    gen = summarize_generation(infos, verify=None)
    assert gen["rows_verified"] == 2 and gen["rows_draft_dropped"] == 3 and gen["drafting_stopped"] == stop
    plain = summarize_generation([replace(row, drafting_stopped=None)] * 2, verify=None)
    assert plain["rows_draft_dropped"] == 0 and "drafting_stopped" not in plain and drafting_note(plain) == ""
    header = " ".join(generation_paths([SimpleNamespace(label="early", toolfid={"generation": gen}),
                                        SimpleNamespace(label="fine", toolfid={"generation": plain})]).split())
    assert (f"tokens of early: {reason}; drafting stopped after 2 rows: drafts were rejected early (first "
            "verification passes gained 9% of the draft tokens they sent; drafting pays from 40%), so 3 of 5 rows "
            "were decoded instead") in header
    assert f"tokens of fine: {reason}" in header and "fine: " + reason + ";" not in header
