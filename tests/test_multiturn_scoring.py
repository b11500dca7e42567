"""Multi-turn scoring: result grounding, per-depth summaries, the multi-turn gate of the verdict."""

from __future__ import annotations

import json

import pytest

from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.core.records import Case, PairScore
from lm_eval_toolfid.scoring.compare import pair
from lm_eval_toolfid.scoring.grounding import appears_in, result_values
from lm_eval_toolfid.scoring.metrics import METRIC_BY_NAME, case_items, summarize
from lm_eval_toolfid.scoring.outcome import score_generation
from lm_eval_toolfid.scoring.verdict import MIN_GATE_N, VerdictConfig, judge

from .test_case_history import TOOLS
from .test_multiturn_prompts import MULTITURN_CASES, flight_case


def call(name: str, **arguments) -> str:
    return json.dumps({"name": name, "arguments": arguments})


# --- which expected values come from a tool result ---------------------------------------------------

def test_values_from_results_appear_in_a_result_and_in_no_user_turn():
    case = flight_case()  # gold {"flight_id": "AZ123", "passengers": 2}; "2 people" is in the user's turn
    found = result_values(case)
    assert [(v.tool, v.path, v.value) for v in found] == [("book_flight", ("flight_id",), "AZ123")]
    single = Case.model_validate({"id": "s", "prompt": "Book AZ123", "tools": TOOLS, "gold_tool_name": "book_flight",
                                  "gold_arguments": {"flight_id": "AZ123"}})
    assert result_values(single) == []


@pytest.mark.parametrize("value, text, found", [
    ("AZ123", '{"id": "AZ123"}', True), ("az123", '{"id": "AZ123"}', True), ("12", '{"n": 123}', False),
    ("on", "Boston", False), (129, '{"price": 129}', True), (129.0, '{"price": 129}', True),
    (12.5, '{"price": 12.55}', False), (3, "2025-03-14", False), ("Rome", "Paris to Rome.", True),
    (True, "true", False), ("", "anything", False), ("BG-20931", "code BG-20931.", True),
])
def test_values_match_whole_tokens(value, text, found):
    assert appears_in(value, [text]) is found


def test_result_grounding_counts_reproduced_result_values_per_view():
    case = flight_case()
    right = score_generation(call("book_flight", flight_id="AZ123", passengers=2), case)
    wrong = score_generation(call("book_flight", flight_id="AF999", passengers=2), case)
    prose = score_generation("I booked the cheapest flight for you.", case)
    assert (right.result_grounding, wrong.result_grounding, prose.result_grounding) == ((1, 1), (0, 1), (0, 1))
    assert right.valid and wrong.valid and not prose.valid  # grounding is not validity


def test_options_and_nested_values_count_per_parameter():
    cases = {c.id: c for c in load_cases(MULTITURN_CASES)}
    refund = cases["mt-order-refund"]  # options: amount [84.5] comes from the result
    assert [v.path for v in result_values(refund)] == [("amount",)]
    assert score_generation(call("refund_order", order_id="55102", amount=84.5), refund).result_grounding == (1, 1)
    assert score_generation(call("refund_order", order_id="55102", amount=80), refund).result_grounding == (0, 1)
    email = cases["mt-order-status-refund-partial"]  # to and body come from the two results
    out = score_generation(call("send_email", to="sam@example.org", subject="Refund", body="RF-3390"), email)
    assert out.result_grounding == (2, 2) and out.gold_args
    assert result_values(cases["mt-weather-answer"]) == []  # no call expected: nothing to ground


def test_result_grounding_rate_is_a_ratio_and_absent_without_result_values():
    case = flight_case()
    single = Case.model_validate({"id": "s", "prompt": "Book AZ123 for 2", "tools": TOOLS,
                                  "gold_tool_name": "book_flight", "gold_arguments": {"flight_id": "AZ123"}})
    ok = call("book_flight", flight_id="AZ123", passengers=2)
    pairs = [pair(case, score_generation(ok, case), score_generation("no idea", case)),
             pair(case.model_copy(update={"id": "m2"}), score_generation("no idea", case), score_generation(ok, case)),
             pair(single, score_generation(ok, single), score_generation(ok, single))]
    assert [case_items(p).get("result_grounding_rate") for p in pairs] == [[1, 1], [0, 1], None]
    summary = summarize(pairs)
    assert summary.get("result_grounding_rate") == 0.5 and summary.get("base_result_grounding_rate") == 0.5
    assert summary.denominators["result_grounding_rate"] == 2
    only_single = summarize([pairs[2]])
    assert only_single.get("result_grounding_rate") is None and only_single.by_depth is None
    assert not METRIC_BY_NAME["result_grounding_rate"].paired and METRIC_BY_NAME["base_result_grounding_rate"].paired


# --- per-depth summaries and the verdict ---------------------------------------------------------------

def _cases() -> tuple[Case, Case, Case]:
    single = Case.model_validate({"id": "s", "prompt": "Book AZ123 for 2 people", "tools": TOOLS,
                                  "gold_tool_name": "book_flight", "gold_arguments": {"flight_id": "AZ123",
                                                                                      "passengers": 2}})
    deep = flight_case(id="d3", history=[
        *flight_case().model_dump(mode="json")["history"][:2],
        {"role": "assistant", "content": "Which one should I book?"},
        {"role": "user", "content": "The cheapest, for 2 people."}])
    return single, flight_case(), deep


def runs(single_lost: int, multi_lost: int, n_single: int = 40, n_multi: int = 24,
         multi_base_valid: int | None = None) -> list[PairScore]:
    """Scored pairs: ``n_single`` single-turn and ``n_multi`` multi-turn cases (half of depth 2, half 3),
    every base view valid (or the first ``multi_base_valid`` multi-turn ones), the adapter losing the
    first ``single_lost`` / ``multi_lost`` of them."""
    single, two, three = _cases()
    ok = call("book_flight", flight_id="AZ123", passengers=2)
    out = []
    for i in range(n_single):
        out.append(pair(single, score_generation("prose" if i < single_lost else ok, single),
                        score_generation(ok, single)).model_copy(update={"case_id": f"s{i}"}))
    for i in range(n_multi):
        case = two if i % 2 else three
        base_ok = multi_base_valid is None or i < multi_base_valid
        out.append(pair(case, score_generation("prose" if i < multi_lost else ok, case),
                        score_generation(ok if base_ok else "prose", case)).model_copy(update={"case_id": f"m{i}"}))
    return out


def test_summaries_per_turn_depth():
    summary = summarize(runs(0, 6))
    assert set(summary.by_depth) == {"1", "2", "3+", "2+"}
    assert summary.by_depth["1"].n == 40 and summary.by_depth["2+"].n == 24
    assert summary.by_depth["2"].n == summary.by_depth["3+"].n == 12
    assert summary.by_depth["1"].validity_delta == 0 and summary.by_depth["2+"].validity_delta == -0.25
    assert summary.by_depth["2+"].by_depth is None  # one level only
    assert summary.by_depth["2+"].get("result_grounding_rate") == pytest.approx(18 / 24)


def test_adapter_that_breaks_only_multi_turn_cases_fails_although_the_whole_set_passes():
    pairs = runs(0, 14, n_single=300, n_multi=24)  # whole set: -14/324 = -0.043 >= -0.05
    verdict = judge(summarize(pairs))
    assert verdict.label == "FAIL" and verdict.failed_gates() == ["multiturn_validity_delta"]
    assert verdict.reason.startswith("multi-turn cases alone: validity_delta -0.583 < -0.050 (statistically clear")
    assert "while single-turn cases hold (validity_delta +0.000)" in verdict.reason
    whole = next(g for g in verdict.gates if g.name == "validity_delta")
    assert whole.passed and whole.value == pytest.approx(-14 / 324)


def test_whole_set_failure_names_the_multi_turn_cases_when_single_turn_ones_hold():
    verdict = judge(summarize(runs(0, 24)))
    assert verdict.label == "FAIL"
    assert verdict.reason.startswith("validity_delta -0.375 < -0.050 (statistically clear")
    assert "; multi-turn cases alone: validity_delta -1.000 < -0.050 (statistically clear" in verdict.reason
    broken = judge(summarize(runs(40, 24)))  # every depth fails alike: the whole set's reason says it all
    assert broken.label == "FAIL" and "multi-turn" not in broken.reason
    assert "multiturn_validity_delta" in broken.failed_gates()


def test_multi_turn_gate_fails_only_when_clear_and_only_on_enough_cases():
    noisy = judge(summarize(runs(0, 3)))  # -3/24: below the floor, but within noise
    gate = next(g for g in noisy.gates if g.name == "multiturn_validity_delta")
    assert noisy.label == "PASS" and gate.passed and "within noise" in gate.note
    assert "multi-turn cases alone: validity_delta -0.125 is below the floor within noise" in noisy.reason
    few = judge(summarize(runs(0, 10, n_multi=MIN_GATE_N - 2)))
    assert "multiturn_validity_delta" not in [g.name for g in few.gates]
    assert any("too few to gate" in n and "-0.556" in n for n in few.notes)
    weak = judge(summarize(runs(0, 2, multi_base_valid=3)))  # the base: 3 of 24 multi-turn cases valid
    assert "multiturn_validity_delta" not in [g.name for g in weak.gates]
    assert any("the base makes valid calls on only 12% of them" in n for n in weak.notes)


@pytest.mark.parametrize("mode", ["point", "noninferiority"])
def test_an_adapter_that_changes_nothing_never_fails_the_multi_turn_gate(mode):
    verdict = judge(summarize(runs(0, 0)), VerdictConfig(gate_mode=mode))
    gate = next(g for g in verdict.gates if g.name == "multiturn_validity_delta")
    assert gate.passed and verdict.passed is not False


def test_single_turn_sets_have_no_multi_turn_gate():
    verdict = judge(summarize(runs(2, 0, n_multi=0)))
    assert [g.name for g in verdict.gates] == ["validity_delta", "hallucination_delta"]
    assert not any("multi-turn" in n for n in verdict.notes)
