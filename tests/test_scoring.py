"""Scoring core: outcome taxonomy, hallucination surface, leaf disagreement, aggregation."""

import json

import pytest

from lm_eval_toolfid.core.records import OutcomeKind
from lm_eval_toolfid.scoring.compare import field_disagreement, pair
from lm_eval_toolfid.scoring.outcome import score_generation
from lm_eval_toolfid.scoring.metrics import summarize

from .conftest import make_case


def call(name="get_weather", **args):
    return json.dumps({"name": name, "arguments": args or {"city": "Paris"}})


@pytest.mark.parametrize("text,kind,keyword", [
    ("It is sunny in Paris.", OutcomeKind.NO_CALL, None),
    ('{"name": "get_weather", "arguments": {"city": "Pa', OutcomeKind.MALFORMED, None),
    ('{"tool": "get_weather", "args": {}}', OutcomeKind.WRONG_SHAPE, "name"),
    # string-encoded arguments are decoded by the parser (and the call flagged): valid by default
    ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', OutcomeKind.VALID, None),
    ('{"name": "get_weather", "arguments": "city=Paris"}', OutcomeKind.WRONG_SHAPE, "arguments_string"),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Pa</tool_call>', OutcomeKind.MALFORMED, None),
    ('get_weather(city=__import__("os").getcwd())', OutcomeKind.MALFORMED, None),
    ('{"name": "get_weather", "arguments": [1]}', OutcomeKind.WRONG_SHAPE, "arguments"),
    ('{"name": "get_weather", "arguments": {"unit": "celsius"}}', OutcomeKind.SCHEMA_ERROR, "required"),
    ('{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}', OutcomeKind.SCHEMA_ERROR, "enum"),
    ('{"name": "get_weather", "arguments": {"city": "P", "where": {"lat": 1}}}', OutcomeKind.SCHEMA_ERROR, "required"),
    ('{"name": "get_weather", "arguments": {"city": "P", "tags": ["a", 2]}}', OutcomeKind.SCHEMA_ERROR, "type"),
    ('{"name": "get_weather", "arguments": {"city": "P", "days": 1.5}}', OutcomeKind.SCHEMA_ERROR, "type"),
    ('{"name": "get_weather", "arguments": {"city": "P", "days": 0}}', OutcomeKind.SCHEMA_ERROR, "minimum"),
    (call(), OutcomeKind.VALID, None),
])
def test_outcome_taxonomy(text, kind, keyword):
    outcome = score_generation(text, make_case())
    assert outcome.kind is kind
    assert outcome.keyword == keyword


def test_call_is_validated_against_the_tool_it_names():
    case = make_case()
    assert score_generation('{"name": "get_time", "arguments": {"tz": "UTC"}}', case).valid
    assert score_generation('{"name": "get_time", "arguments": {"city": "Paris"}}', case).keyword == "required"


def test_renamed_tool_is_valid_but_hallucinated_under_declared_surface():
    case = make_case(allowed_tools=["get_weather", "get_time"])
    outcome = score_generation(call("fetch_weather_report"), case)
    assert outcome.valid and outcome.hallucinated
    assert score_generation(call("get_weather"), case).hallucinated is False
    # another offered tool is inside the declared surface: not a hallucination
    assert score_generation('{"name": "get_time", "arguments": {"tz": "UTC"}}', case).hallucinated is False


def test_without_declared_surface_the_gold_name_rules():
    case = make_case()
    assert score_generation('{"name": "get_time", "arguments": {"tz": "UTC"}}', case).hallucinated is True
    assert score_generation('{"name": "get_time", "arguments": {"tz": "UTC"}}', case,
                            task_allowed=["get_time"]).hallucinated is False


def test_leaf_disagreement_keeps_json_types_apart():
    assert field_disagreement({"a": 1}, {"a": 1}) == 0.0
    assert field_disagreement({"a": 1}, {"a": 1.0}) == 1.0
    assert field_disagreement({"a": 1}, {"a": True}) == 1.0
    assert field_disagreement({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}}) == 0.5
    assert field_disagreement({"a": 1}, {"b": 1}) == 1.0  # each path present on one side only
    assert field_disagreement({}, {}) == 0.0
    assert field_disagreement({"x": None}, {}) == 1.0  # null is not absence


def test_summary_of_paired_run():
    case = make_case(allowed_tools=["get_weather", "get_time"])
    ft_texts = [call(city="Paris"), call(city="Rome"), "prose", call("ghost_tool")]
    base_texts = [call(city="Paris"), call(city="Roma"), call(), call()]
    pairs = [pair(case.model_copy(update={"id": f"c{i}"}), score_generation(f, case), score_generation(b, case))
             for i, (f, b) in enumerate(zip(ft_texts, base_texts))]
    s = summarize(pairs)
    assert s.n == 4 and s.paired
    assert s.json_valid_rate == 0.75 and s.base_json_valid_rate == 1.0
    assert s.validity_delta == pytest.approx(-0.25)
    assert s.hallucination_rate == pytest.approx(1 / 3)
    assert s.get("parse_rate") == 0.75
    assert s.denominators["arg_disagreement"] == 3
    assert s.get("arg_disagreement") == pytest.approx((0 + 1 + 0) / 3)
    assert s.outcome_counts == {"no_call": 1, "valid": 3}
    lo, hi = s.validity_delta_ci
    assert lo < -0.25 < hi


def test_summary_without_base_is_unpaired_and_no_valid_call_means_no_hallucination_denominator():
    case = make_case()
    s = summarize([pair("a", score_generation("nope", case), None)])
    assert not s.paired and s.validity_delta is None
    assert s.get("hallucination_rate") is None and s.n_valid == 0


def test_a_case_with_no_tools_makes_any_call_a_false_call():
    """An irrelevance case that offers no tool (BFCL live_irrelevance's ``"function": []``)."""
    case = make_case(tools=[], gold_tool_name=None)
    assert case.irrelevant and case.tools == []
    made = score_generation(call("get_weather", city="Paris"), case)
    assert (made.kind, made.keyword, made.attempted) == (OutcomeKind.SCHEMA_ERROR, "unknown_tool", True)
    assert made.calls[0].offered is False and made.calls[0].hallucinated is True
    assert made.gold_tool is None and made.gold_args is None
    two = score_generation(json.dumps([{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]), case)
    assert two.n_calls == 2 and all(c.hallucinated and c.keyword == "unknown_tool" for c in two.calls)
    broken = score_generation('{"name": "get_weather", "arguments": {"city": "Pa', case)
    assert broken.kind is OutcomeKind.MALFORMED and broken.attempted
    declined = score_generation("I have no tool for that; 2+2 is 4.", case)
    assert declined.kind is OutcomeKind.NO_CALL and not declined.attempted
    surface = score_generation(call("x"), make_case(tools=[], gold_tool_name=None, allowed_tools=[]))
    assert surface.calls[0].hallucinated is True

    # aggregated with the same functions lm-eval gets: a false call, no validity denominator
    pairs = [pair(case, made, declined), pair(case, declined, declined), pair(case, broken, made)]
    s = summarize(pairs)
    assert (s.n, s.n_relevant, s.n_irrelevant) == (3, 0, 3)
    assert s.get("false_call_rate") == pytest.approx(2 / 3) and s.get("base_false_call_rate") == pytest.approx(1 / 3)
    assert s.get("false_call_delta") == pytest.approx(1 / 3)
    assert s.get("json_valid_rate") is None and s.get("validity_delta") is None
    assert s.get("name_hallucination_rate") == 1.0 and s.denominators["name_hallucination_rate"] == 1
