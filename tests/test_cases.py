"""Case files: validated, and every problem is one line naming file:line."""

import json

import pytest

from lm_eval_toolfid.cases.load import case_set_hash, load_cases
from lm_eval_toolfid.core.errors import ToolfidError

TOOL = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                              "required": ["city"]}}
GOOD = {"id": "a", "prompt": "weather in Paris", "tools": [TOOL], "gold_tool_name": "get_weather"}


def write(tmp_path, *lines):
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_loads_tools_list_and_original_single_tool_spec(tmp_path):
    original = {"id": "b", "prompt": "p", "tool_spec": TOOL, "gold_tool_name": "get_weather", "max_new_tokens": 64}
    wrapped = {**GOOD, "id": "c", "tools": [{"type": "function", "function": TOOL}]}
    cases = load_cases(write(tmp_path, GOOD, "", original, wrapped))
    assert [c.id for c in cases] == ["a", "b", "c"]
    assert cases[1].tool_names == ["get_weather"] and cases[1].max_new_tokens == 64
    assert cases[2].tools[0].name == "get_weather"


@pytest.mark.parametrize("bad,needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ({**GOOD, "gold_tool_name": "nope"}, "not among the offered tools"),
    ({k: v for k, v in GOOD.items() if k != "prompt"}, "prompt"),
    ({**GOOD, "tools": [TOOL, TOOL]}, "duplicate tool names"),
    ({**GOOD, "tools": [{"name": "get_weather", "parameters": {"type": "strng"}}]}, "not a valid JSON Schema"),
    ({**GOOD, "max_new_tokens": -3}, "max_new_tokens"),
    ({**GOOD, "surprise": 1}, "surprise"),
    ({**GOOD, "tools": []}, "expects a call but offers no tools"),
    ({**GOOD, "tools": [], "gold_tool_name": None, "gold_calls": [{"name": "get_weather"}]}, "offers no tools"),
])
def test_malformed_lines_name_file_and_line(tmp_path, bad, needle):
    path = write(tmp_path, GOOD, bad)
    with pytest.raises(ToolfidError) as err:
        load_cases(path)
    message = str(err.value)
    assert f"{path}:2:" in message and needle in message
    assert "\n" not in message


def test_duplicate_ids_and_empty_files(tmp_path):
    with pytest.raises(ToolfidError, match="duplicate case id 'a'"):
        load_cases(write(tmp_path, GOOD, GOOD))
    with pytest.raises(ToolfidError, match="no cases"):
        load_cases(write(tmp_path, ""))
    with pytest.raises(ToolfidError, match="not found"):
        load_cases(tmp_path / "missing.jsonl")


def test_case_set_hash_tracks_content_not_formatting(tmp_path):
    a = load_cases(write(tmp_path, GOOD))
    b = load_cases(write(tmp_path, json.dumps(GOOD, indent=None, separators=(",", ":"))))
    c = load_cases(write(tmp_path, {**GOOD, "prompt": "weather in Rome"}))
    assert case_set_hash(a) == case_set_hash(b) != case_set_hash(c)


def test_an_irrelevance_case_may_offer_no_tools(tmp_path):
    """BFCL's live_irrelevance has questions with ``"function": []``: no tool at all, any call is a false call."""
    none = {"id": "n", "prompt": "What's 2+2?", "tools": [], "irrelevant": True}
    null_gold = {"id": "m", "prompt": "Tell me a joke.", "tools": [], "gold_tool_name": None}
    cases = load_cases(write(tmp_path, GOOD, none, null_gold))
    assert [(c.id, c.tools, c.irrelevant, c.expected_calls) for c in cases[1:]] == [
        ("n", [], True, []), ("m", [], True, [])]
    assert cases[1].gold_tool is None and cases[1].tool_names == []
    with pytest.raises(ToolfidError, match=r"cases\.jsonl:1: tools"):  # 'tools' stays required
        load_cases(write(tmp_path, {"id": "x", "prompt": "p", "irrelevant": True}))


def test_a_case_must_say_what_it_expects(tmp_path):
    """No gold_tool_name, no gold_calls and no irrelevant: true is not silently an irrelevance case: refused with
    file:line. An explicit ``"gold_tool_name": null`` or ``"irrelevant": true`` is one."""
    silent = {"id": "s", "prompt": "weather in Paris", "tools": [TOOL]}
    path = write(tmp_path, GOOD, silent)
    with pytest.raises(ToolfidError) as err:
        load_cases(path)
    assert str(err.value).startswith(f"{path}:2: the case does not say what it expects")
    assert '"irrelevant": true' in str(err.value) and "\n" not in str(err.value)
    cases = load_cases(write(tmp_path, GOOD, {**silent, "irrelevant": True}, {**silent, "id": "t",
                                                                             "gold_tool_name": None}))
    assert [c.irrelevant for c in cases] == [False, True, True]
