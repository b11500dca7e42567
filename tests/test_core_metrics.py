"""The scoring core's metrics, the paired CI and the verdict rules (issue: verdicts you can trust)."""

from __future__ import annotations

import json
import random

import pytest

from lm_eval_toolfid.core.records import PairScore
from lm_eval_toolfid.scoring.metrics import METRICS, case_items, summarize
from lm_eval_toolfid.scoring.compare import field_disagreement, pair
from lm_eval_toolfid.scoring.gold import options_match
from lm_eval_toolfid.scoring.outcome import score_generation
from lm_eval_toolfid.core.stats import difference_ci, paired_difference_ci
from lm_eval_toolfid.scoring.verdict import VerdictConfig, judge

from .conftest import make_case


def call(name="get_weather", **arguments):
    return json.dumps({"name": name, "arguments": arguments})


def run(case, ft_texts, base_texts):
    """Records of several copies of ``case`` (ids c0, c1, …) under both views."""
    pairs = []
    for i, (ft, base) in enumerate(zip(ft_texts, base_texts)):
        c = case.model_copy(update={"id": f"c{i}"})
        pairs.append(pair(c, score_generation(ft, c), score_generation(base, c), ft, base))
    return summarize(pairs)


# --- names -----------------------------------------------------------------------------------

def test_invented_name_with_broken_arguments_is_counted_by_name_hallucination_only():
    case = make_case()
    s = run(case, [call("fetch_weather", location="Paris"), call(city="Paris")],
            [call(city="Paris"), call(city="Paris")])
    # fetch_weather's arguments fail the gold tool's schema: not valid, so the original
    # definition (over valid calls) never sees the invented name …
    assert s.get("hallucination_rate") == 0.0 and s.denominators["hallucination_rate"] == 1
    # … but the name-level rate, over every call that names a tool, does.
    assert s.get("name_hallucination_rate") == pytest.approx(0.5)
    assert s.get("base_name_hallucination_rate") == 0.0


def test_switching_between_offered_tools_is_a_tool_choice_change():
    case = make_case(allowed_tools=["get_weather", "get_time"])
    s = run(case, [call("get_time", tz="UTC"), call(city="Rome")], [call(city="Paris"), call(city="Rome")])
    assert s.get("tool_choice_change_rate") == pytest.approx(0.5)
    assert s.get("name_hallucination_rate") == 0.0  # both names are on the declared surface
    assert s.get("gold_tool_rate") == pytest.approx(0.5) and s.get("base_gold_tool_rate") == 1.0


def test_hallucination_delta_judges_the_change_not_the_model():
    case = make_case(allowed_tools=["get_weather", "get_time"])
    ghost = call("ghost_tool", city="Paris")  # valid against the gold schema, outside the surface
    same = [ghost] + [call(city="Paris")] * 7
    s = run(case, same, same)
    assert s.get("hallucination_rate") == pytest.approx(1 / 8)  # the base does it too
    assert s.get("hallucination_delta") == 0.0
    v = judge(s)
    assert v.passed is True  # absolute rule would fail (0.125 > 0.10); the change is zero
    assert judge(s, VerdictConfig(hallucination_gate="absolute")).passed is False
    assert any("identical_output_rate 1.0" in n for n in v.notes)
    assert s.get("identical_output_rate") == 1.0


# --- gold values -----------------------------------------------------------------------------

def test_gold_arguments_match_is_value_level():
    case = make_case(gold_arguments={"city": "Paris", "days": 3})
    s = run(case, [call(city="Paris", days=3), call(city="Paris", days=3.0), call(city="Lyon", days=3),
                   call(city="Paris")],
            [call(city="Paris", days=3)] * 4)
    # same schema validity everywhere, but the third and fourth stopped copying values
    assert s.json_valid_rate == 1.0
    assert s.get("gold_args_match_rate") == pytest.approx(0.5) and s.get("base_gold_args_match_rate") == 1.0


def test_bfcl_style_options():
    options = {"city": ["Paris", "paris"], "unit": ["celsius", ""], "where": [{"lat": [1.0], "lon": [2, 2.0]}],
               "tags": [["a", "b"]]}
    assert options_match({"city": "Paris", "where": {"lat": 1, "lon": 2}, "tags": ["a", "b"]}, options)
    assert options_match({"city": "paris", "unit": "celsius", "where": {"lat": 1.0, "lon": 2.0}, "tags": ["a", "b"]},
                         options)
    assert not options_match({"city": "Paris", "where": {"lat": 1, "lon": 2}}, options)  # tags may not be omitted
    assert not options_match({"city": "Rome", "where": {"lat": 1, "lon": 2}, "tags": ["a", "b"]}, options)
    assert not options_match({"city": "Paris", "where": {"lat": 1, "lon": 2}, "tags": ["a", "b"], "x": 1}, options)
    assert not options_match({"city": "Paris", "unit": True, "where": {"lat": 1, "lon": 2}, "tags": ["a", "b"]},
                             options)


# --- several calls, irrelevance ---------------------------------------------------------------

def test_parallel_calls_are_matched_as_a_multiset():
    case = make_case(gold_tool_name=None, gold_calls=[
        {"name": "get_time", "arguments": {"tz": "UTC"}}, {"name": "get_weather", "options": {"city": ["Paris"]}}])
    both = json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}},
                       {"name": "get_time", "arguments": {"tz": "UTC"}}])
    one_broken = json.dumps([{"name": "get_weather", "arguments": {"city": 3}},
                             {"name": "get_time", "arguments": {"tz": "UTC"}}])
    only_one = call("get_time", tz="UTC")
    o = score_generation(both, case)
    assert o.valid and o.n_calls == 2 and o.gold_tool and o.gold_args
    o = score_generation(one_broken, case)
    assert o.kind.value == "schema_error" and o.keyword == "type"  # valid only when every call is
    o = score_generation(only_one, case)
    assert o.valid and o.gold_tool is False and o.gold_args is False


def test_irrelevance_cases_measure_false_calls_and_a_malformed_attempt_is_an_attempt():
    case = make_case(gold_tool_name=None)
    assert case.irrelevant and case.expected_calls == []
    s = run(case, ["I cannot help with that.", '{"name": "get_weather", "argum', call(city="x")],
            ["No tool fits.", "No tool fits.", "No tool fits."])
    assert s.n_irrelevant == 3 and s.get("json_valid_rate") is None  # validity is about cases expecting a call
    assert s.get("false_call_rate") == pytest.approx(2 / 3) and s.get("base_false_call_rate") == 0.0
    assert s.get("false_call_delta") == pytest.approx(2 / 3)


def test_format_drift():
    case = make_case()
    fenced = "```json\n" + call(city="Paris") + "\n```"
    s = run(case, [fenced, call(city="Paris")], [call(city="Paris"), call(city="Paris")])
    assert s.get("format_drift_rate") == pytest.approx(0.5)


# --- argument disagreement -------------------------------------------------------------------

def test_disagreement_is_type_aware_at_every_depth():
    assert field_disagreement({"a": [1]}, {"a": [1.0]}) == 1.0
    assert field_disagreement({"a": [1]}, {"a": [True]}) == 1.0
    assert field_disagreement({"a": [1, 2]}, {"a": [1, 2]}) == 0.0
    assert field_disagreement({"a": [{"b": 1}, 2]}, {"a": [{"b": 1.0}, 2]}) == 0.5
    assert field_disagreement({"a": []}, {"a": {}}) == 1.0
    assert field_disagreement({"a": [1, 2]}, {"a": [1]}) == 0.5  # index 1 exists on one side only


# --- statistics ------------------------------------------------------------------------------

def test_paired_ci_brackets_the_estimate_and_stays_wide_without_changes():
    lo, hi = paired_difference_ci([0] * 10, [1] * 10)
    assert lo < -0.2 and hi > 0.2  # ten unchanged cases do not prove "exactly zero"
    lo, hi = paired_difference_ci([0] * 1000, [1] * 1000)
    assert -0.01 < lo < 0 < hi < 0.01
    deltas = [-1] * 15 + [1] * 5 + [0] * 80
    base = [1] * 15 + [0] * 5 + [1] * 40 + [0] * 40
    lo, hi = paired_difference_ci(deltas, base)
    assert lo < -0.10 < hi


def test_paired_ci_agrees_with_a_paired_bootstrap():
    rng = random.Random(7)
    deltas = [-1] * 15 + [1] * 5 + [0] * 80
    base = [1] * 15 + [0] * 5 + [1] * 40 + [0] * 40
    boot = sorted(sum(deltas[rng.randrange(100)] for _ in range(100)) / 100 for _ in range(4000))
    b_lo, b_hi = boot[100], boot[3899]
    lo, hi = paired_difference_ci(deltas, base)
    assert abs(lo - b_lo) < 0.03 and abs(hi - b_hi) < 0.03


def test_unpaired_difference_ci():
    lo, hi = difference_ci(10, 100, 10, 100)
    assert lo < 0 < hi
    assert difference_ci(0, 0, 1, 2) is None


# --- verdict rules ---------------------------------------------------------------------------

def test_no_evidence_is_undecided_not_pass():
    case = make_case()
    prose = ["I would call the weather tool."] * 20
    weak_base = prose[:19] + [call(city="Paris")]
    s = run(case, prose, weak_base)  # base 5% valid, adapter 0%: delta −0.05 ≥ floor
    v = judge(s)
    assert v.passed is None and v.label == "UNDECIDED" and "only 5%" in v.reason
    # without the base guard the validity gate holds (−0.05 ≥ floor), but an adapter with no valid call never
    # PASSes: its hallucination is not measured (the rule before min_base_validity passed it)
    loose = judge(s, VerdictConfig(min_base_validity=0.0))
    assert loose.passed is None and loose.reason == "hallucination not measured: the adapter makes no valid call"


def test_noninferiority_mode_never_fails_an_identical_adapter():
    case = make_case()
    same = [call(city="Paris")] * 30
    s = run(case, same, same)
    assert judge(s).passed is True
    v = judge(s, VerdictConfig(gate_mode="noninferiority"))
    assert v.passed is None and "non-inferiority not shown" in v.reason  # 30 cases cannot show it
    big = run(case, [call(city="Paris")] * 400, [call(city="Paris")] * 400)
    assert judge(big, VerdictConfig(gate_mode="noninferiority")).passed is True
    worse = run(case, ["prose"] * 10 + [call(city="Paris")] * 20, [call(city="Paris")] * 30)
    assert judge(worse, VerdictConfig(gate_mode="noninferiority")).passed is False


def test_failed_gate_says_clear_or_not():
    case = make_case()
    noisy = run(case, ["prose"] * 2 + [call(city="P")] * 18, [call(city="P")] * 20)  # −0.10 on 20 cases
    v = judge(noisy)  # a FAIL all the same: the wording must not read as "ignore this"
    assert v.passed is False and "(not statistically clear" in v.reason and "noise" not in v.reason
    clear = run(case, ["prose"] * 60 + [call(city="P")] * 40, [call(city="P")] * 100)
    assert "(statistically clear" in judge(clear).reason


def test_every_metric_item_is_defined_for_records_round_tripped_through_json():
    case = make_case(gold_arguments={"city": "Paris"})
    record = pair(case, score_generation(call(city="Paris"), case), score_generation("prose", case), "a", "b")
    again = PairScore.model_validate(json.loads(json.dumps(record.model_dump(mode="json"))))
    assert case_items(again) == case_items(record)
    assert {m.name for m in METRICS} >= {"name_hallucination_rate", "gold_tool_rate", "gold_args_match_rate",
                                         "tool_choice_change_rate", "identical_output_rate", "hallucination_delta",
                                         "base_hallucination_rate", "false_call_rate", "format_drift_rate"}


# --- absurd output ---------------------------------------------------------------------------

@pytest.mark.parametrize("depth", [40, 60, 260, 100_000])
def test_deep_arguments_never_break_a_record(depth):
    case = make_case()
    deep = '{"name": "get_weather", "arguments": {"city": "Paris", "tags": ' + "[" * depth + "]" * depth + "}}"
    o = score_generation(deep, case)
    record = pair(case, o, o, deep, deep)
    json.dumps(record.model_dump(mode="json"))  # used to raise "Maximum serialization depth exceeded"
    # within the parser's depth cap the call is parsed and fails its schema; beyond it, malformed
    assert o.kind.value == ("schema_error" if depth <= 60 else "malformed")


def test_scoring_one_case_cannot_raise(monkeypatch):
    import lm_eval_toolfid.scoring.outcome as scoring

    def boom(*_a, **_k):
        raise RuntimeError("validator bug")

    monkeypatch.setattr(scoring, "validate_arguments", boom)
    o = score_generation(call(city="Paris"), make_case())
    assert o.kind.value == "malformed" and o.keyword == "scoring_error" and "validator bug" in o.detail


def test_a_primed_prompt_cannot_show_a_false_call_and_the_verdict_says_so():
    """plain-v3 starts every answer with ``{"name": "``: on a case that expects no call both views 'attempt' a
    call whatever the model would have done, so false_call_delta would be 0 by construction and its gate could
    never fail. Such cases leave the false-call metrics, and the verdict names what was not measured."""
    from lm_eval_toolfid.core.records import Case
    from lm_eval_toolfid.scoring.compare import pair
    from lm_eval_toolfid.scoring.metrics import summarize
    from lm_eval_toolfid.scoring.outcome import score_generation
    from lm_eval_toolfid.scoring.verdict import judge

    tools = [{"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}]
    call = '{"name": "get_time", "arguments": {"tz": "UTC"}}'
    relevant = Case(id="r", prompt="time in UTC?", tools=tools, gold_tool_name="get_time")
    none = Case(id="n", prompt="tell me a joke", tools=tools, gold_tool_name=None)
    records = []
    for i in range(25):
        records.append(pair(relevant, score_generation(call, relevant), score_generation(call, relevant)))
        base, ft = score_generation("Why did...", none), score_generation(call, none)
        records.append(pair(none, ft, base).model_copy(update={"case_id": f"n{i}"}))
    unprimed = summarize(records)
    assert unprimed.get("false_call_delta") == 1.0
    assert judge(unprimed).passed is False and "false_call_delta" in judge(unprimed).reason
    primed = summarize([r.model_copy(update={"primed": True}) for r in records])
    assert primed.get("false_call_rate") is None and "false_call_delta" not in primed.metrics or \
        primed.get("false_call_delta") is None
    verdict = judge(primed)
    assert verdict.passed is True and any("false calls not measured" in n for n in verdict.notes)


# --- a paired metric with an undefined side is undefined ----------------------------------------

def _view(kind: str = "valid", name: str | None = "get_weather", hallucinated: bool = False, offered: bool = True,
          surface: str = "bare_json", attempted: bool | None = None):
    from lm_eval_toolfid.core.records import CallOutcome, Outcome, OutcomeKind

    k = OutcomeKind(kind)
    calls = [CallOutcome(kind=k, name=name, surface=surface, offered=offered, hallucinated=hallucinated)] \
        if k.parsed else []
    return Outcome(kind=k, name=name if k.parsed else None, surface=surface if k.parsed else None, calls=calls,
                   n_calls=len(calls), hallucinated=hallucinated if k is OutcomeKind.VALID else None,
                   attempted=k is not OutcomeKind.NO_CALL if attempted is None else attempted)


def _pairs(views, relevant=True, depth=1):
    """PairScore records from (adapter, base) outcomes."""
    return [PairScore(case_id=f"p{i}", ft=ft, base=base, relevant=relevant, turn_depth=depth,
                      arg_disagreement=0.0 if ft.valid and base.valid else None)
            for i, (ft, base) in enumerate(views)]


PROSE = "no_call"
EMPTY_SIDE = {
    # metric: (records where one view has no case in the metric's denominator, where both do)
    "hallucination_delta": (  # the adapter makes no valid call (BFCL live_multiple: a prose LoRA)
        _pairs([(_view(PROSE), _view(hallucinated=True))] * 3 + [(_view(PROSE), _view())]),
        _pairs([(_view(), _view(hallucinated=True))] * 3 + [(_view(), _view())])),
    "hallucination_delta (base side)": (  # the base makes none
        _pairs([(_view(hallucinated=True), _view(PROSE))] * 4),
        _pairs([(_view(hallucinated=True), _view())] * 4)),
    "arg_disagreement": (  # no case valid in both views
        _pairs([(_view(), _view(PROSE)), (_view(PROSE), _view())]),
        _pairs([(_view(), _view())])),
    "tool_choice_change_rate": (  # one view never calls an offered tool
        _pairs([(_view(PROSE), _view())] * 2), _pairs([(_view(name="get_time"), _view())] * 2)),
    "format_drift_rate": (  # one view never parses a call
        _pairs([(_view(PROSE), _view())] * 2), _pairs([(_view(surface="fenced"), _view())] * 2)),
    "validity_delta": (  # no case expects a call: no side has a denominator
        _pairs([(_view(PROSE), _view(PROSE))] * 2, relevant=False), _pairs([(_view(PROSE), _view())] * 2)),
    "validity_mcnemar_p": (
        _pairs([(_view(PROSE), _view(PROSE))] * 2, relevant=False), _pairs([(_view(PROSE), _view())] * 2)),
}


@pytest.mark.parametrize("label", sorted(EMPTY_SIDE))
def test_a_paired_metric_with_an_empty_side_is_absent_not_a_number(label):
    """Every paired metric that is a difference or needs both views is absent (None in the summary, None from
    the aggregation lm-eval calls) when one view has no case in its denominator — never ``0 − base``."""
    from lm_eval_toolfid.scoring.metrics import METRIC_BY_NAME

    name = label.split(" ")[0]
    metric = METRIC_BY_NAME[name]
    empty, full = EMPTY_SIDE[label]
    for records, defined in ((empty, False), (full, True)):
        s = summarize(records)
        items = [case_items(p)[name] for p in records if name in case_items(p)]
        lm_eval_value = metric.aggregate(items) if items else None  # what lm-eval reports (no items: no key)
        assert (s.get(name) is not None) is defined and (lm_eval_value is not None) is defined, (label, s.get(name))
        assert s.get(name) == lm_eval_value
    if name == "hallucination_delta":
        s = summarize(empty)
        assert s.hallucination_delta_ci is None
        undefined, defined_side = ("base_hallucination_rate", "hallucination_rate") if "base" in label else \
            ("hallucination_rate", "base_hallucination_rate")
        assert s.get(undefined) is None and s.get(defined_side) is not None


def test_delta_of_rates_is_undefined_when_either_rate_is():
    from lm_eval_toolfid.scoring.metrics import DELTA_OF_RATES, METRICS, delta_of_rates

    assert delta_of_rates([[None, 1], [None, 0]]) is None  # adapter undefined: not −0.5
    assert delta_of_rates([[1, None], [0, None]]) is None  # base undefined: not +0.5
    assert delta_of_rates([[None, None]]) is None
    assert delta_of_rates([[1, 0], [None, 1]]) == pytest.approx(0.5)  # each over its own denominator
    # every paired difference of two rates is listed, so readers of older results files can drop stale ones
    assert {m.name for m in METRICS if m.aggregate is delta_of_rates} == set(DELTA_OF_RATES)
    # the difference interval with an empty side is undefined too
    assert difference_ci(0, 0, 1, 2) is None and difference_ci(1, 2, 0, 0) is None


def test_false_call_delta_with_an_empty_side_is_absent():
    """false_call_delta's items are [adapter, base] per irrelevance case; with one side undefined (a base record
    without that case's view) the delta is absent, not the other side's rate."""
    from lm_eval_toolfid.scoring.metrics import METRIC_BY_NAME

    metric = METRIC_BY_NAME["false_call_delta"]
    assert metric.aggregate([[1, None], [1, None]]) is None and metric.aggregate([[None, 0], [None, 1]]) is None
    s = summarize(_pairs([(_view(), _view(PROSE)), (_view(PROSE), _view(PROSE))], relevant=False))
    assert s.get("false_call_delta") == pytest.approx(0.5)  # both sides defined: the difference


def test_per_depth_deltas_are_absent_where_a_view_has_no_valid_call():
    """A depth where the adapter makes no valid call has no hallucination_delta there, while the whole set has."""
    single = _pairs([(_view(), _view(hallucinated=True))] * 3)
    multi = [p.model_copy(update={"case_id": f"m{i}", "turn_depth": 2})
             for i, p in enumerate(_pairs([(_view(PROSE), _view(hallucinated=True))] * 3))]
    s = summarize(single + multi)
    assert s.get("hallucination_delta") == pytest.approx(-1.0)
    assert s.by_depth["1"].get("hallucination_delta") == pytest.approx(-1.0)
    assert s.by_depth["2"].get("hallucination_delta") is None and s.by_depth["2+"].hallucination_delta_ci is None
