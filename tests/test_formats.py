"""Every surface format: with and without special-token markers, several calls, round trips,
string-encoded arguments, pythonic edge cases, malformed attempts, limits."""

from __future__ import annotations

import json
import sys

import pytest

from lm_eval_toolfid.formats import (FORMATS, MAX_CALLS, MAX_DEPTH, REGISTRY, SCAN_CAP, bounded_copy, parse_calls,
                                     render_call, spans)
from lm_eval_toolfid.formats import driver
from lm_eval_toolfid.core.records import OutcomeKind, SurfaceFormat
from lm_eval_toolfid.scoring.outcome import score_generation

from .conftest import make_case

S = SurfaceFormat
ARGS = {"city": "Paris", "days": 3, "where": {"lat": 48.85, "lon": -2.35}, "tags": ["a", "b"],
        "unit": "celsius", "flag": True, "none": None, "num_text": "123", "empty": ""}


@pytest.fixture(autouse=True)
def _strict_parser(monkeypatch):
    """Parser bugs must show up as exceptions here, not be hidden by the never-raise net."""
    monkeypatch.setattr(driver, "RAISE_INTERNAL_ERRORS", True)


def calls(text):
    return [(c.name, c.arguments) for c in parse_calls(text).calls]


def surfaces(text):
    return [c.surface for c in parse_calls(text).calls]


@pytest.mark.parametrize("markers", [True, False], ids=["markers", "no-markers"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_every_format(fmt, markers):
    text = render_call("get_weather", ARGS, fmt, markers=markers)
    parsed = parse_calls(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", ARGS)], text
    spec = REGISTRY[fmt]
    expected = spec.surface if markers else spec.surface_without_markers
    assert parsed.calls[0].surface is expected
    assert score_generation(text, make_case(tools=[{"name": "get_weather", "parameters": {"type": "object"}}],
                                            gold_tool_name="get_weather")).valid


def test_markers_dropped_by_the_decoder_give_the_same_calls():
    for fmt, spec in REGISTRY.items():
        if spec.has_markers:
            with_markers = render_call("f", {"a": 1}, fmt)
            without = render_call("f", {"a": 1}, fmt, markers=False)
            assert with_markers != without
            assert calls(with_markers) == calls(without) == [("f", {"a": 1})]


def test_unknown_format_and_inexpressible_pythonic_are_value_errors():
    with pytest.raises(ValueError, match="unknown format"):
        render_call("f", {}, "yaml")
    with pytest.raises(ValueError, match="cannot be written"):
        render_call("f", {"from": 1}, "pythonic")  # a Python keyword cannot be a keyword argument


# --- individual formats -----------------------------------------------------------------------

def test_bare_json_array_gives_several_calls():
    text = json.dumps([{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}])
    assert calls(text) == [("a", {}), ("b", {"x": 1})]
    assert surfaces(text) == [S.BARE_JSON, S.BARE_JSON]


def test_fenced_json_and_fenced_pythonic():
    assert surfaces('Here:\n```json\n{"name": "a", "arguments": {}}\n```') == [S.FENCED]
    assert calls('```python\n[a(x=1)]\n```') == [("a", {"x": 1})]
    assert surfaces('```python\n[a(x=1)]\n```') == [S.PYTHONIC]
    assert calls('```\n{"name": "a", "arguments": {}}') == [("a", {})]  # unclosed fence


def test_embedded_search_skips_json_that_is_not_a_call():
    text = 'Using {"type": "object"} I call {"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert calls(text) == [("get_weather", {"city": "Paris"})]
    assert surfaces(text) == [S.EMBEDDED]


def test_non_call_json_is_returned_for_wrong_shape_when_nothing_is_call_shaped():
    parsed = parse_calls('I would use {"type": "object"} here')
    assert [c.raw for c in parsed.calls] == [{"type": "object"}]
    outcome = score_generation('{"tool": "get_weather", "args": {}}', make_case())
    assert outcome.kind is OutcomeKind.WRONG_SHAPE and outcome.keyword == "name"


def test_hermes_several_tags_and_an_unclosed_last_tag():
    text = ('<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "b", "arguments": {"y": [1, 2]}}')
    assert calls(text) == [("a", {"x": 1}), ("b", {"y": [1, 2]})]
    assert surfaces(text) == [S.HERMES, S.HERMES]


def test_hermes_body_may_be_pythonic():
    assert calls("<tool_call>[a(x=1), b()]</tool_call>") == [("a", {"x": 1}), ("b", {})]
    assert surfaces("<tool_call>[a(x=1)]</tool_call>") == [S.PYTHONIC]


def test_hermes_wrong_nesting_still_reads_each_body():
    text = '<tool_call><tool_call>{"name": "a", "arguments": {}}</tool_call></tool_call>'
    assert calls(text) == [("a", {})]


def test_hermes_with_broken_json_is_a_malformed_attempt_not_wrong_shape():
    for text in ['<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}</tool_call>',
                 '<tool_call>\n{"name": "get_weather", "argu', "<tool_call>\n</tool_call>"]:
        parsed = parse_calls(text)
        assert parsed.calls == [] and parsed.malformed and S.HERMES in parsed.malformed_formats, text
        outcome = score_generation(text, make_case())
        assert outcome.kind is OutcomeKind.MALFORMED and outcome.surface == S.HERMES


def test_qwen_xml_values_are_json_when_they_parse():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n<parameter=tags>\n[\"a\", 2]\n</parameter>\n"
            "<parameter=flag>\ntrue\n</parameter>\n<parameter=quoted>\n\"42\"\n</parameter>\n"
            "<parameter=code>\nif x < 3:\n    y = {1: 2}\n</parameter>\n</function>\n</tool_call>")
    assert calls(text) == [("get_weather", {"city": "New York", "days": 3, "tags": ["a", 2], "flag": True,
                                            "quoted": "42", "code": "if x < 3:\n    y = {1: 2}"})]
    assert surfaces(text) == [S.QWEN_XML]


def test_qwen_xml_without_wrapper_unclosed_and_several_functions():
    text = "<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n<function=b>\n<parameter=y>\nhi"
    assert calls(text) == [("a", {"x": 1}), ("b", {"y": "hi"})]
    assert calls("<function=get_time>\n</function>") == [("get_time", {})]


def test_llama_parameters_tag_and_semicolons():
    one = '<|python_tag|>{"name": "a", "parameters": {"x": 1}}<|eom_id|>'
    assert calls(one) == [("a", {"x": 1})] and surfaces(one) == [S.LLAMA]
    many = '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}'
    assert calls(many) == calls("<|python_tag|>" + many) == [("a", {"x": 1}), ("b", {})]
    assert surfaces(many) == [S.LLAMA, S.LLAMA]
    assert calls('<|python_tag|>brave_search.call(query="x")') == [("brave_search.call", {"query": "x"})]


def test_mistral_array_inline_and_args_forms():
    assert calls('[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]') == \
        [("a", {"x": 1}), ("b", {})]
    assert calls('[TOOL_CALLS]a{"x": 1}[TOOL_CALLS]b[ARGS]{"y": 2}') == [("a", {"x": 1}), ("b", {"y": 2})]
    assert calls('[TOOL_CALLS]a[CALL_ID]abc123XYZ[ARGS]{"x": 1}') == [("a", {"x": 1})]
    # markers dropped: the array is plain JSON, the inline form a name glued to an object
    assert calls('[{"name": "a", "arguments": {"x": 1}}]') == [("a", {"x": 1})]
    assert calls('a{"x": 1}b{"y": 2}') == [("a", {"x": 1}), ("b", {"y": 2})]
    assert surfaces('a{"x": 1}') == [S.MISTRAL]


def test_mistral_marker_with_garbage_is_malformed():
    parsed = parse_calls("[TOOL_CALLS]a{\"x\": ")
    assert parsed.malformed and S.MISTRAL in parsed.malformed_formats


def test_prose_word_before_a_call_object_is_not_read_as_mistral():
    assert calls('Call {"name": "a", "arguments": {}}') == [("a", {})]
    assert surfaces('Call: {"name": "a", "arguments": {}}') == [S.EMBEDDED]
    # glued to a name, an object with "name"/"parameters" keys is the arguments (BFCL has one)
    assert calls('get_info{"name": "x", "parameters": ["a"]}') == [("get_info", {"name": "x", "parameters": ["a"]})]


def test_openai_forms_decode_string_arguments_and_flag_them():
    args = json.dumps({"city": "Paris"})
    texts = [
        json.dumps({"tool_calls": [{"id": "1", "type": "function", "function": {"name": "a", "arguments": args}},
                                   {"id": "2", "type": "function", "function": {"name": "b", "arguments": "{}"}}]}),
        json.dumps({"function": {"name": "a", "arguments": args}}),
        json.dumps({"name": "a", "arguments": args}),
    ]
    for text in texts:
        parsed = parse_calls(text)
        assert parsed.calls[0].name == "a" and parsed.calls[0].arguments == {"city": "Paris"}
        assert parsed.calls[0].flags == ("arguments_string_decoded",)
        assert parsed.calls[0].surface is S.OPENAI
    assert [c.name for c in parse_calls(texts[0]).calls] == ["a", "b"]
    # an object under "function" with arguments given as an object: not flagged
    plain = parse_calls(json.dumps({"function": {"name": "a", "arguments": {"x": 1}}})).calls[0]
    assert plain.flags == () and plain.arguments == {"x": 1}


def test_string_arguments_that_do_not_decode_stay_strings():
    call = parse_calls('{"name": "a", "arguments": "city=Paris"}').calls[0]
    assert call.arguments == "city=Paris" and call.flags == ()
    assert parse_calls('{"name": "a", "arguments": "[1, 2]"}').calls[0].arguments == "[1, 2]"


def test_function_key_as_the_name():
    assert calls('{"function": "a", "arguments": {"x": 1}}') == [("a", {"x": 1})]


# --- pythonic ---------------------------------------------------------------------------------

def test_pythonic_literals():
    text = '[math.sum(a=-1, b=-2.5, c=(1, 2), d={"k": [None, True, False]}, e="x"), g(), h(x=true, y=null)]'
    assert calls(text) == [("math.sum", {"a": -1, "b": -2.5, "c": [1, 2], "d": {"k": [None, True, False]},
                                         "e": "x"}), ("g", {}), ("h", {"x": True, "y": None})]
    assert calls("get_weather(city='Paris')") == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("text", [
    "f(a=__import__('os').system('echo pwned'))",
    "f(a=exec('import sys; sys.TOOLFID_PWNED = 1'))",
    "f(a=x)", "f(1)", "f(**{'a': 1})", "f(a=1+2)", "f(a={1, 2})", "f(a=b'x')", "f(a=1j)", "f(a=1e999)",
    "f(a=lambda: 1)", "f(a=[i for i in range(3)])", "f(a={'k': 1, **d})", "f(a={1: 2})", "f(a=-True)",
    "f(a=1, a=2)", "[f(a=1), 3]", "f(a=" + "[" * 5000, "f(a=" + "[" * 100 + "]" * 100 + ")",
    "f(a=" + "1" * 5000 + ")", "f(a='\ud800')x",
])
def test_pythonic_non_literals_are_malformed_and_never_executed(text):
    parsed = parse_calls(text)
    assert parsed.calls == [] and parsed.malformed, text
    assert S.PYTHONIC in parsed.malformed_formats
    assert not hasattr(sys, "TOOLFID_PWNED")


def test_pythonic_prose_is_not_an_attempt():
    parsed = parse_calls("The weather (in Paris) is fine.")
    assert parsed.calls == [] and not parsed.malformed


# --- hostile values ---------------------------------------------------------------------------

def test_nan_and_infinity_are_not_json():
    for bad in ["NaN", "Infinity", "-Infinity", "1e999"]:
        parsed = parse_calls('{"name": "a", "arguments": {"x": %s}}' % bad)
        assert parsed.calls == [] and parsed.malformed, bad


def test_duplicate_keys_last_wins():
    assert calls('{"name": "a", "name": "b", "arguments": {"x": 1, "x": 2}}') == [("b", {"x": 2})]


def test_huge_ints_and_lone_surrogates():
    huge = "9" * 5000  # beyond Python's int-string conversion limit
    parsed = parse_calls('{"name": "a", "arguments": {"x": %s}}' % huge)
    assert parsed.calls == [] and parsed.malformed
    ok = parse_calls('{"name": "a", "arguments": {"x": %s}}' % ("9" * 4000)).calls[0]
    assert ok.arguments["x"] == int("9" * 4000)
    sur = parse_calls('{"name": "a\ud800", "arguments": {"x": "\\udc00", "\\ud83d\\ude00": 1}}').calls[0]
    assert sur.name == "a\ufffd" and sur.arguments == {"x": "\ufffd", "\U0001F600": 1}
    outcome = score_generation('{"name": "get_weather", "arguments": {"city": "\\ud800"}}', make_case())
    json.dumps(outcome.model_dump(mode="json"))
    outcome.model_dump_json()


def test_depth_cap():
    deep = {"a": 1}
    for _ in range(MAX_DEPTH + 5):
        deep = {"a": deep}
    text = json.dumps({"name": "a", "arguments": deep})
    parsed = parse_calls(text)
    assert parsed.calls == [] and parsed.malformed
    shallow = {"a": 1}
    for _ in range(MAX_DEPTH - 5):
        shallow = {"a": shallow}
    assert calls(json.dumps({"name": "a", "arguments": shallow})) == [("a", shallow)]


def test_scan_cap_and_call_cap():
    call = json.dumps({"name": "a", "arguments": {}})
    assert calls("x" * (SCAN_CAP - len(call) - 10) + " " + call) == [("a", {})]
    assert calls("x" * SCAN_CAP + call) == []
    many = "".join(f"<tool_call>{call}</tool_call>" for _ in range(MAX_CALLS + 10))
    assert len(parse_calls(many).calls) == MAX_CALLS


def test_spans_are_balanced_string_aware_and_depth_capped():
    text = 'a {"k": "}{][", "l": [1, {"m": 2}]} b [x} ]'
    assert [text[s.start:s.end] for s in spans(text)] == [
        '{"k": "}{][", "l": [1, {"m": 2}]}', '[1, {"m": 2}]', '{"m": 2}', "[x} ]"]
    deep = "[" * 1000 + "]" * 1000
    assert max(s.height for s in spans(deep)) == MAX_DEPTH
    assert len(spans(deep)) == MAX_DEPTH


def test_never_raises_on_odd_inputs():
    for text in ["", None, 12345, "{" * 100_000, "[" * 50_000, "}" * 10, '{"a":' * 5000, "\x00\ud800",
                 "<tool_call>" * 100, "[TOOL_CALLS]" * 100, "<function=" * 100, "<|python_tag|>" * 100,
                 "```" * 101, "f(" * 1000, '"' * 1001, "\\" * 1001]:
        parse_calls(text)


# --- bounded_copy -----------------------------------------------------------------------------

def test_bounded_copy_bounds_depth_items_strings_and_is_serialisable():
    deep: object = 1
    for _ in range(1000):
        deep = [deep]
    value = {"deep": deep, "many": list(range(5000)), "long": "x" * 50_000, "nan": float("nan"),
             "sur": "\ud800", 3: "int key", "tuple": (1, 2), "huge": 10 ** 5000, "obj": object()}
    out = bounded_copy(value, max_depth=32, max_items=100, max_str=1000)
    text = json.dumps(out, allow_nan=False)
    assert len(text) < 10_000
    assert out["many"][:3] == [0, 1, 2] and out["many"][-1] == "<truncated>" and len(out["many"]) == 101
    assert out["long"].endswith("<truncated>") and len(out["long"]) == 1000 + len("<truncated>")
    assert out["nan"] is None and out["sur"] == "\ufffd" and out["3"] == "int key" and out["tuple"] == [1, 2]
    assert out["huge"] == "<truncated>" and out["obj"].startswith("<object object")
    depth, node = 0, out["deep"]
    while isinstance(node, list):
        depth, node = depth + 1, node[0]
    assert depth == 31 and node == "<truncated>"  # the top dict is level 1
    small = {"a": [1, {"b": "c"}], "d": None}
    assert bounded_copy(small) == small
