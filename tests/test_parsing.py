"""Parsing: text → calls, each knowing where it came from."""

import json

from lm_eval_toolfid.formats.common import json_values
from lm_eval_toolfid.formats import parse_calls
from lm_eval_toolfid.core.records import SurfaceFormat

CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}


def test_bare_json():
    parsed = parse_calls(json.dumps(CALL))
    assert [c.name for c in parsed.calls] == ["get_weather"]
    assert parsed.calls[0].surface is SurfaceFormat.BARE_JSON
    assert parsed.calls[0].arguments == {"city": "Paris"}


def test_fenced_block_wins_over_embedded_fragments():
    text = 'Sure: {"note": 1}\n```json\n' + json.dumps(CALL) + "\n```"
    parsed = parse_calls(text)
    assert parsed.calls[0].surface is SurfaceFormat.FENCED
    assert parsed.calls[0].name == "get_weather"


def test_first_balanced_object_inside_prose_with_braces_in_strings():
    text = 'I will call {"name": "get_weather", "arguments": {"city": "Pa}ris {x"}} and then stop.'
    parsed = parse_calls(text)
    assert parsed.calls[0].surface is SurfaceFormat.EMBEDDED
    assert parsed.calls[0].arguments == {"city": "Pa}ris {x"}


def test_prose_quotes_do_not_confuse_the_scanner():
    text = 'He said "hi {" and then {"name": "a", "arguments": {}}'
    # the one-pass scan is fooled by the stray '{' in quotes; the restart pass at '{"name"' is not
    parsed = parse_calls(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("a", {})]
    assert json_values('x {"a": [1, {"b": "}"}]} y [2]') == [{"a": [1, {"b": "}"}]}, [2]]


def test_json_array_yields_several_calls():
    parsed = parse_calls(json.dumps([CALL, {"name": "get_time", "arguments": {"tz": "UTC"}}]))
    assert [c.name for c in parsed.calls] == ["get_weather", "get_time"]


def test_no_json_and_truncated_json_are_told_apart():
    assert parse_calls("I think it is sunny.").calls == []
    assert parse_calls("I think it is sunny.").saw_object_start is False
    truncated = parse_calls('{"name": "get_weather", "arguments": {"city": "Par')
    assert truncated.calls == [] and truncated.saw_object_start is True


def test_absurd_inputs_never_raise():
    for text in ["", None, "{" * 100_000, "[" * 50_000, "}" * 10, '{"a":' * 5000, "\x00\ud800", 12345]:
        parse_calls(text)  # must not raise
