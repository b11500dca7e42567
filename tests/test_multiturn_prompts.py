"""A case's conversation history in every prompt style; single-turn prompts render exactly as before."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.core.records import Case
from lm_eval_toolfid.prompts.chat import ChatPrompter
from lm_eval_toolfid.prompts.history import HISTORY_FORMAT
from lm_eval_toolfid.prompts.plain import pick_demos
from lm_eval_toolfid.prompts.prompter import Prompter
from lm_eval_toolfid.prompts.settings import PRIMER

from .chat_templates import ALTERNATING, HERMES, HERMES_TOOLS, IGNORES_TOOLS, NO_SYSTEM
from .test_case_history import OPENAI_HISTORY, TOOLS
from .test_prompt_styles import chat_base

MULTITURN_CASES = "tests/data/multiturn_cases.jsonl"


def flight_case(**extra) -> Case:
    data = {"id": "m1", "prompt": "Find flights from Paris to Rome.", "tools": TOOLS, "history": OPENAI_HISTORY,
            "gold_tool_name": "book_flight", "gold_arguments": {"flight_id": "AZ123", "passengers": 2}}
    return Case.model_validate({**data, **extra})


@pytest.fixture()
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(fixture_paths()["base"], local_files_only=True)


# --- single-turn prompts are untouched -----------------------------------------------------------

# sha256[:16] of every prompt of the fixture's 48 single-turn cases, and the prompt fingerprint, as the
# code rendered them before histories existed (commit 9eba0c8): references and calibrations of existing
# users must still pair.
BEFORE = {
    "plain-v1/2": ("958dba86c2c89441", "21dd9709d4d6a401"),
    "plain-v2/2": ("307c6cc7955adaf1", "9fb2d4736891901b"),
    "plain-v3/1": ("c0f5740e1a0a044a", "230909da6bb583ce"),
    "plain-v1/0": ("9bc2ae1fd642dd7c", "3e7e7e4b2a65c7ad"),
    "raw": ("cd9625380837d9f6", "e27aecb8fd73167a"),
}
BEFORE_CHAT = {
    "HERMES/0": "94a9efcfe4b968ae", "HERMES/1": "2fcc0f2e6796cc3b",
    "IGNORES_TOOLS/0": "6e7951a19de4db69", "IGNORES_TOOLS/1": "9dc11993acf4ab38",
    "NO_SYSTEM/0": "63bc8e3db860ab84", "NO_SYSTEM/1": "34b7772106866b42",
}


def _digest(texts) -> str:
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]


def single_turn_fixture_cases() -> list[Case]:
    cases = [c for c in load_cases("fixture") if not c.history]
    assert len(cases) == 48
    return cases


@pytest.mark.parametrize("variant", sorted(BEFORE))
def test_single_turn_case_sets_render_byte_for_byte_as_before(variant):
    cases = single_turn_fixture_cases()
    style = "raw" if variant == "raw" else "plain"
    template, demos = ("plain-v1", 0) if variant == "raw" else variant.split("/")
    p = Prompter(style, demos=int(demos), template=template, cases=cases)
    assert (_digest(p.render(c) for c in cases), p.settings.fingerprint()) == BEFORE[variant]
    assert p.settings.history is None and "chat_history_in" not in p.provenance()


@pytest.mark.parametrize("variant", sorted(BEFORE_CHAT))
def test_single_turn_chat_prompts_render_as_before(tokenizer, variant):
    name, demos = variant.split("/")
    tokenizer.chat_template = {"HERMES": HERMES, "IGNORES_TOOLS": IGNORES_TOOLS, "NO_SYSTEM": NO_SYSTEM}[name]
    chat = ChatPrompter(tokenizer, "t")
    cases = single_turn_fixture_cases()
    assert _digest(chat.render(c, pick_demos(c, int(demos)), "Be brief.") for c in cases) == BEFORE_CHAT[variant]


# --- plain and raw ----------------------------------------------------------------------------------

def test_plain_renders_the_conversation_as_a_transcript_in_the_plain_blocks():
    case = flight_case()
    text = Prompter("plain", demos=0, template="plain-v1", cases=[case]).render(case)
    assert text.endswith(
        "### Request\nFind flights from Paris to Rome.\n"
        "### Call\n{\"name\": \"search_flights\", \"arguments\": {\"origin\": \"Paris\", \"dest\": \"Rome\"}}\n"
        "### Result\n{\"flights\": [{\"id\": \"AZ123\", \"price\": 129}]}\n"
        "### Request\nBook the cheapest for 2 people.\n"
        "### Call\n")
    assert text.count("### Tools") == 1
    v3 = Prompter("plain", demos=1, template="plain-v3", cases=[case]).render(case)
    assert v3.endswith("### Request\nBook the cheapest for 2 people.\n### Call\n" + PRIMER)


def test_plain_transcript_of_parallel_calls_and_assistant_text():
    cases = {c.id: c for c in load_cases(MULTITURN_CASES)}
    prompter = Prompter("plain", demos=0, cases=list(cases.values()))
    parallel = prompter.render(cases["mt-weather-parallel-email"])
    assert ('### Call\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
            '{"name": "get_weather", "arguments": {"city": "Madrid"}}\n### Result\n') in parallel
    assert parallel.count("### Result\n") == 2 and parallel.index("Oslo") < parallel.index("Madrid")
    said = prompter.render(cases["mt-order-refund"])
    assert "### Reply\nLet me look up the order first.\n### Call\n" in said
    reply_only = prompter.render(cases["mt-build-issue"])
    assert "### Reply\nThe build failed: test_checkout_total is failing.\n### Request\nOpen an issue" in reply_only


def test_raw_renders_role_labelled_turns_ending_where_the_assistant_speaks():
    case = flight_case()
    assert Prompter("raw", cases=[case]).render(case) == (
        "User: Find flights from Paris to Rome.\n\n"
        'Assistant: {"name": "search_flights", "arguments": {"origin": "Paris", "dest": "Rome"}}\n\n'
        'Tool result (search_flights): {"flights": [{"id": "AZ123", "price": 129}]}\n\n'
        "User: Book the cheapest for 2 people.\n\nAssistant:")


def test_history_is_part_of_the_fingerprint_of_multi_turn_case_sets_only(tmp_path):
    single = Case.model_validate({"id": "s", "prompt": "p", "tools": TOOLS, "gold_tool_name": "book_flight"})
    one = Prompter("plain", demos=0, cases=[single])
    both = Prompter("plain", demos=0, cases=[single, flight_case()])
    assert one.settings.history is None and both.settings.history == HISTORY_FORMAT
    assert one.render(single) == both.render(single)  # the single case renders the same either way
    assert one.settings.fingerprint() != both.settings.fingerprint()
    chat = Prompter("chat", demos=0, model_args={"pretrained": str(chat_base(tmp_path, HERMES_TOOLS))},
                    cases=[single, flight_case()])
    assert chat.settings.history == f"{HISTORY_FORMAT}; chat: template"
    assert chat.provenance()["chat_history_in"] == "template"


# --- chat -----------------------------------------------------------------------------------------

def _order(text: str, *parts: str) -> bool:
    positions = [text.index(p) for p in parts]
    return positions == sorted(positions)


def test_chat_renders_calls_and_results_the_way_the_template_writes_them(tokenizer, caplog):
    tokenizer.chat_template = HERMES_TOOLS
    chat = ChatPrompter(tokenizer, "hermes-tools")
    with caplog.at_level(logging.WARNING, logger="lm_eval.toolfid"):
        text = chat.render(flight_case(), [])
    assert chat.history_in == ("template", "template") and "do not render" not in caplog.text
    call = '<tool_call>\n{"name": "search_flights", "arguments": {"origin": "Paris", "dest": "Rome"}}\n</tool_call>'
    result = '<tool_response>\n{"flights": [{"id": "AZ123", "price": 129}]}\n</tool_response>'
    assert call in text and result in text
    assert _order(text, "Find flights from Paris to Rome.", call, result, "Book the cheapest for 2 people.")
    assert text.endswith("<|im_start|>assistant\n") and "<tools>" in text and "Tool result" not in text


@pytest.mark.parametrize("template, calls_in, results_in", [
    (HERMES, "text", "template"),          # renders every role's content, knows no tool_calls
    (IGNORES_TOOLS, "text", "template"),
    (NO_SYSTEM, "text", "template"),
    (ALTERNATING, "text", "user"),         # raises on a tool role: results go in user turns, merged
])
def test_chat_templates_that_cannot_render_the_history_get_it_as_text(tokenizer, caplog, template, calls_in,
                                                                      results_in):
    tokenizer.chat_template = template
    chat = ChatPrompter(tokenizer, "tpl")
    with caplog.at_level(logging.WARNING, logger="lm_eval.toolfid"):
        text = chat.render(flight_case(), [])
        chat.render(flight_case(id="m2"), [])
    assert chat.history_in == (calls_in, results_in)
    assert caplog.text.count("does not render a conversation's tool calls") == 1  # warned once
    call = '{"name": "search_flights", "arguments": {"origin": "Paris", "dest": "Rome"}}'
    if template in (HERMES,):
        call = "<tool_call>\n" + call + "\n</tool_call>"  # the template's own call format
    assert call in text and '{"flights": [{"id": "AZ123", "price": 129}]}' in text
    if results_in == "user":
        assert ('Tool result (search_flights): {"flights": [{"id": "AZ123", "price": 129}]}\n\n'
                "Book the cheapest for 2 people.") in text  # one user turn: roles still alternate
    assert _order(text, "Find flights", call, "AZ123", "Book the cheapest")


ONE_CALL_PER_TURN = HERMES_TOOLS.replace(
    "{%- for m in messages %}",
    "{%- for m in messages %}{% if m.tool_calls and m.tool_calls | length > 1 %}"
    "{{ raise_exception('only one tool call per turn') }}{% endif %}", 1)


def test_a_case_the_template_cannot_render_natively_gets_its_history_as_text(tmp_path, caplog):
    cases = load_cases(MULTITURN_CASES)
    base = chat_base(tmp_path, ONE_CALL_PER_TURN)
    with caplog.at_level(logging.WARNING, logger="lm_eval.toolfid"):
        prompter = Prompter("chat", demos=0, model_args={"pretrained": str(base)}, cases=cases)
        texts = {c.id: prompter.render(c) for c in cases}
    assert prompter.provenance()["chat_history_in"] == "template"
    assert prompter.provenance()["chat_history_text_cases"] == ["mt-weather-parallel-email"]
    assert "<tool_response>" not in texts["mt-weather-parallel-email"]
    assert "Tool result (get_weather)" in texts["mt-weather-parallel-email"]
    assert all("<tool_response>" in t for cid, t in texts.items() if cid != "mt-weather-parallel-email")
    assert caplog.text.count("cannot render the history") == 1


def test_every_style_renders_every_hand_made_conversation(tmp_path):
    cases = load_cases(MULTITURN_CASES)
    assert {c.turn_depth for c in cases} == {2, 3} and any(c.irrelevant for c in cases)
    for style, kw in (("plain", {"template": "plain-v3"}), ("plain", {"template": "plain-v1"}), ("raw", {}),
                      ("chat", {"model_args": {"pretrained": str(chat_base(tmp_path, HERMES_TOOLS))}})):
        p = Prompter(style, demos=1, cases=cases, **kw)
        for case in cases:
            text = p.render(case)
            at = text.index(case.prompt)
            for msg in case.history:  # every turn of the conversation is in the prompt, in order
                shown = msg.content if msg.role != "assistant" or not msg.tool_calls else \
                    json.dumps(msg.tool_calls[-1].arguments, ensure_ascii=False)
                assert shown and shown in text[at:], (style, case.id, shown)
                at = text.index(shown, at)


# --- assistant turns of text (no tool_calls) ----------------------------------------------------------

PROSE = [{"role": "assistant", "content": "Which date do you want to fly?"}, {"role": "user", "content": "June 12."}]


def prose_case(**extra) -> Case:
    return flight_case(history=PROSE, gold_tool_name="search_flights",
                       gold_arguments={"origin": "Paris", "dest": "Rome"}, **extra)


def test_assistant_text_turns_render_in_plain_and_raw():
    case = prose_case()
    text = Prompter("plain", demos=0, template="plain-v1", cases=[case]).render(case)
    assert text.endswith("### Request\nFind flights from Paris to Rome.\n"
                         "### Reply\nWhich date do you want to fly?\n"
                         "### Request\nJune 12.\n### Call\n")
    assert Prompter("raw", cases=[case]).render(case) == (
        "User: Find flights from Paris to Rome.\n\nAssistant: Which date do you want to fly?\n\n"
        "User: June 12.\n\nAssistant:")


@pytest.mark.parametrize("template", ["HERMES_TOOLS", "HERMES", "IGNORES_TOOLS", "NO_SYSTEM", "ALTERNATING"])
def test_assistant_text_turns_render_as_assistant_messages_in_chat(tokenizer, template):
    """The text is the content of an assistant message of the template, between the request and the later
    user turn, whatever the template does with tool calls (no tool call to fall back on)."""
    tokenizer.chat_template = {"HERMES_TOOLS": HERMES_TOOLS, "HERMES": HERMES, "IGNORES_TOOLS": IGNORES_TOOLS,
                               "NO_SYSTEM": NO_SYSTEM, "ALTERNATING": ALTERNATING}[template]
    chat = ChatPrompter(tokenizer, template, warn=False)
    case = prose_case()
    messages, _ = chat.messages(case, [], None)
    assert messages[-2:] == [{"role": "assistant", "content": "Which date do you want to fly?"},
                             {"role": "user", "content": "June 12."}]
    text = chat.render(case, [])
    assistant = "<start_of_turn>model\n" if template in ("NO_SYSTEM", "ALTERNATING") else "<|im_start|>assistant\n"
    if template == "NO_SYSTEM":
        assistant = "<start_of_turn>assistant\n"
    assert assistant + "Which date do you want to fly?" in text
    assert _order(text, "Find flights from Paris to Rome.", "Which date do you want to fly?", "June 12.")
    assert "Tool result" not in text and not chat.history_text_cases
