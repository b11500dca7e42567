"""Cases with a conversation history (multi-turn): the record, its validation, its place in the hash."""

from __future__ import annotations

import json

import pytest

from lm_eval_toolfid.cases.load import case_set_hash, load_cases
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import Case

TOOLS = [
    {"name": "search_flights", "parameters": {"type": "object", "properties": {
        "origin": {"type": "string"}, "dest": {"type": "string"}}, "required": ["origin", "dest"]}},
    {"name": "book_flight", "parameters": {"type": "object", "properties": {
        "flight_id": {"type": "string"}, "passengers": {"type": "integer"}}, "required": ["flight_id"]}},
]
OPENAI_HISTORY = [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_a", "type": "function", "function": {
        "name": "search_flights", "arguments": json.dumps({"origin": "Paris", "dest": "Rome"})}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": {"flights": [{"id": "AZ123", "price": 129}]}},
    {"role": "user", "content": "Book the cheapest for 2 people."},
]


def case(history, **extra):
    data = {"id": "m1", "prompt": "Find flights from Paris to Rome.", "tools": TOOLS, "history": history,
            "gold_tool_name": "book_flight", "gold_arguments": {"flight_id": "AZ123", "passengers": 2}}
    data.update(extra)
    return Case.model_validate(data)


def test_openai_shaped_history_is_normalised():
    c = case(OPENAI_HISTORY)
    assert c.turn_depth == 2
    call = c.history[0].tool_calls[0]
    assert (call.id, call.name, call.arguments) == ("call_a", "search_flights", {"origin": "Paris", "dest": "Rome"})
    result = c.history[1]
    assert result.name == "search_flights" and result.tool_call_id == "call_a"
    assert json.loads(result.content) == {"flights": [{"id": "AZ123", "price": 129}]}


def test_calls_without_ids_are_answered_in_order_and_get_ids():
    c = case([{"role": "assistant", "tool_calls": [{"name": "search_flights", "arguments": {"origin": "A", "dest": "B"}},
                                                  {"name": "search_flights", "arguments": {"origin": "B", "dest": "A"}}]},
              {"role": "tool", "content": "out"}, {"role": "tool", "content": "back"}])
    ids = [t.id for t in c.history[0].tool_calls]
    assert len(set(ids)) == 2 and [m.tool_call_id for m in c.history[1:]] == ids


PROSE_HISTORY = [  # an earlier answer in words (no tool_calls), as BFCL live_irrelevance conversations have
    {"role": "assistant", "content": "Which date do you want to fly?"},
    {"role": "user", "content": "June 12."},
]


def test_assistant_text_turns_without_calls_load_and_count_as_turns(tmp_path):
    """Turn depth is 1 + every assistant turn of the history, a turn of text as much as a turn of calls: the
    model answers after that many turns of its own."""
    prose = case(PROSE_HISTORY, gold_tool_name="search_flights", gold_arguments={"origin": "Paris", "dest": "Rome"})
    assert prose.turn_depth == 2
    assert [(m.role, m.content, m.tool_calls) for m in prose.history] == [
        ("assistant", "Which date do you want to fly?", None), ("user", "June 12.", None)]
    mixed = case(OPENAI_HISTORY[:2] + [{"role": "assistant", "content": "AZ123 costs 129 EUR."}] + OPENAI_HISTORY[2:])
    assert mixed.turn_depth == 3 and mixed.history[2].content == "AZ123 costs 129 EUR."
    irrelevant = case(PROSE_HISTORY, gold_tool_name=None, gold_arguments=None, tools=[])
    assert irrelevant.irrelevant and irrelevant.turn_depth == 2
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(c.model_dump(mode="json")) + "\n" for c in (prose, mixed.model_copy(
        update={"id": "m2"}))))
    loaded = load_cases(str(path))
    assert [c.history for c in loaded] == [prose.history, mixed.history]
    assert case_set_hash(loaded) != case_set_hash([prose])


def test_single_turn_cases_hash_as_before():
    plain = Case.model_validate({"id": "s", "prompt": "p", "tools": TOOLS, "gold_tool_name": "book_flight"})
    assert "history" not in json.dumps(plain.model_dump(mode="json", exclude={"history"}))
    assert case_set_hash([plain]) != case_set_hash([case(OPENAI_HISTORY)])
    # the default set is single-turn: its hash must not depend on the history field existing
    cases = load_cases("default")
    assert all(c.turn_depth == 1 for c in cases if not c.history)


@pytest.mark.parametrize("history, message", [
    ([{"role": "tool", "content": "x"}], "must answer a call"),
    ([{"role": "assistant", "tool_calls": [{"name": "nope", "arguments": {}}]}, {"role": "tool", "content": "x"}],
     "not among the offered tools"),
    ([{"role": "assistant", "tool_calls": [{"name": "search_flights", "arguments": {}}]}], "unanswered calls"),
    ([{"role": "assistant", "tool_calls": [{"name": "search_flights", "arguments": {}}]},
      {"role": "user", "content": "hm"}], "not all answered"),
    ([{"role": "assistant", "content": "hi"}], "ends with an assistant turn"),
    ([{"role": "system", "content": "hi"}], "system message"),
    ([{"role": "assistant", "tool_calls": [{"id": "x", "name": "search_flights", "arguments": {}}]},
      {"role": "tool", "tool_call_id": "y", "content": "r"}], "answers no pending call"),
    ([{"role": "assistant", "tool_calls": [{"name": "search_flights", "arguments": "{not json"}]},
      {"role": "tool", "content": "r"}], "not JSON"),
    ([{"role": "user", "content": ""}], "non-empty 'content'"),
    # assistant text turns (no tool_calls) keep every rule
    ([{"role": "assistant", "content": "Which day?"}, {"role": "user", "content": "today"},
      {"role": "assistant", "content": "Noted."}], "ends with an assistant turn"),
    ([{"role": "assistant", "content": ""}, {"role": "user", "content": "today"}], "needs 'content' or 'tool_calls'"),
    ([{"role": "assistant", "content": "Let me check."}, {"role": "tool", "content": "x"}], "must answer a call"),
    ([{"role": "assistant", "tool_calls": [{"name": "search_flights", "arguments": {}}]},
      {"role": "assistant", "content": "Searching."}, {"role": "tool", "content": "x"}], "not all answered"),
    ([{"role": "assistant", "content": "Sure.", "tool_call_id": "x"}, {"role": "user", "content": "ok"}],
     "'content' and/or 'tool_calls' only"),
])
def test_bad_history_is_one_line_naming_file_and_line(tmp_path, history, message):
    data = {"id": "m", "prompt": "p", "tools": TOOLS, "history": history, "gold_tool_name": "book_flight"}
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps({**data, "id": "ok", "history": []}) + "\n" + json.dumps(data) + "\n")
    with pytest.raises(ToolfidError) as err:
        load_cases(str(path))
    text = str(err.value)
    assert f"{path}:2:" in text and message in text and "\n" not in text
