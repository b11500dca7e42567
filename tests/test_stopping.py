"""Stop-at-call-end: the pure scanner (shapes, strings, escapes, chunking) and the HFLM wiring.

The wiring test runs real generation (fixture model, default cases with demos, so the tiny model
writes anything from clean calls to runaway text) through lm-eval's HFLM and through ToolfidHFLM,
and checks that both give the same call text after ``truncate_call`` — per-case outcomes stay
identical whether a backend stops early or not — while ToolfidHFLM generates fewer tokens.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lm_eval_toolfid.formats.call_end import CallScanner, call_complete, call_end, truncate_call

CASES = [
    ('{"name": "f", "arguments": {"a": "}{"}} trailing', '{"name": "f", "arguments": {"a": "}{"}}'),
    ('  {"name": "f", "arguments": {}}\n{"name"', '  {"name": "f", "arguments": {}}'),
    ('Sure! {x} then {"name": "f", "arguments": {"a": 1}} more', 'Sure! {x} then {"name": "f", "arguments": {"a": 1}}'),
    ('<tool_call>\n{"name": "f"}\n</tool_call> bla', '<tool_call>\n{"name": "f"}\n</tool_call>'),
    ('[get_weather(city="Paris)"), f(x=\'a]\')] and', '[get_weather(city="Paris)"), f(x=\'a]\')]'),
    ('[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]\nmore',
     '[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]'),
    ('```json\n{"name": "f"}\n``` more', '```json\n{"name": "f"}\n```'),
    ('{"name": "f", "arguments": {"a": "\\"}"}}x', '{"name": "f", "arguments": {"a": "\\"}"}}'),
    ('[1] hmm {"name":"f"} x', '[1] hmm {"name":"f"}'),
    ('{"name": "f", "arguments": {"q": "it\'s {"}} z', '{"name": "f", "arguments": {"q": "it\'s {"}}'),
]
INCOMPLETE = ['{"name": "f", "arg', "<tool_call>{\"name\": \"f\"}", "[f(a=1", "Sure, I can help.", "",
              '{"a": "}"', "```json\n{}"]


@pytest.mark.parametrize("text,want", CASES)
def test_call_end_whole_and_char_by_char(text: str, want: str) -> None:
    assert truncate_call(text) == want
    scanner = CallScanner()
    for ch in text:
        if scanner.feed(ch):
            break
    assert scanner.end == len(want)


@pytest.mark.parametrize("text", INCOMPLETE)
def test_incomplete_never_stops(text: str) -> None:
    assert not call_complete(text)
    assert truncate_call(text) == text


def test_stop_strings_per_sequence_and_split_across_chunks() -> None:
    scanner = CallScanner(stop=["\n###"])
    assert not scanner.feed("no call here\n#")
    assert scanner.feed("## Tools")
    assert scanner.text[: scanner.end] == "no call here"
    assert call_end('{"name": "f"}\n###', stop=["\n###"]) == len('{"name": "f"}')


def test_tag_split_across_chunks() -> None:
    scanner = CallScanner()
    for chunk in ["<tool", "_call>{\"name\": \"f\"}</tool", "_call", ">", " tail"]:
        scanner.feed(chunk)
    assert scanner.text[: scanner.end].endswith("</tool_call>")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab{}[]"\\\' \n:,', max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(alphabet='k{}"\\', max_size=4), kids, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(args=st.dictionaries(st.text(alphabet='ab{}"\\', max_size=5), json_values, max_size=4),
       tail=st.text(alphabet='ab{}[]"\\ \n', max_size=20),
       cuts=st.lists(st.integers(min_value=1, max_value=6), max_size=40))
def test_json_call_ends_exactly_at_its_brace_in_any_chunking(args: dict, tail: str, cuts: list[int]) -> None:
    call = json.dumps({"name": "tool", "arguments": args})
    text = call + tail
    assert call_end(text) == len(call)
    scanner, pos = CallScanner(), 0
    for cut in cuts + [len(text)]:
        if scanner.feed(text[pos:pos + cut]):
            break
        pos += cut
    assert scanner.end == len(call)


def test_hflm_stops_early_with_identical_calls() -> None:
    """Real generation: ToolfidHFLM == HFLM after truncate_call, per case, with fewer tokens."""
    import torch
    from lm_eval.models.huggingface import HFLM

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM
    from lm_eval_toolfid.prompts.settings import PromptSettings
    from lm_eval_toolfid.prompts.prompter import render_prompt

    torch.set_num_threads(1)
    cases = load_cases("fixture")[:12]
    prompts = [render_prompt(c, PromptSettings(demos=1)) for c in cases] + \
              [render_prompt(c, PromptSettings(demos=0)) for c in cases]
    # the fixture model ends a call with "\n###" and EOS; a stop sequence it does not write lets HFLM go on
    # past the call, which is what per-row stopping saves
    gen = {"until": ["\n\n"], "do_sample": False, "max_gen_toks": 48}

    class Req:
        def __init__(self, prompt: str, expected_calls: int = 1) -> None:
            self.args = (prompt, dict(gen))
            self.doc = {"id": "x", "expected_calls": expected_calls}

    base = fixture_paths()["base"]
    plain = HFLM(pretrained=base, batch_size=8, device="cpu")
    stopping = ToolfidHFLM(pretrained=base, batch_size=8, device="cpu")
    full = plain.generate_until([Req(p) for p in prompts], disable_tqdm=True)
    stopped = stopping.generate_until([Req(p) for p in prompts], disable_tqdm=True)
    # cases that expect several calls are never cut short: they generate exactly as HFLM does
    assert stopping.generate_until([Req(p, 2) for p in prompts[:8]], disable_tqdm=True) == full[:8]
    assert [truncate_call(t) for t in full] == [truncate_call(t) for t in stopped]
    assert all(f.startswith(s) for f, s in zip(full, stopped))
    tok = plain.tokenizer
    n_full = sum(len(tok(t)["input_ids"]) for t in full)
    n_stopped = sum(len(tok(t)["input_ids"]) for t in stopped)
    assert any(call_complete(t) for t in stopped)
    assert n_stopped < n_full, (n_stopped, n_full)


def test_answer_text_cuts_single_call_cases_only() -> None:
    from lm_eval_toolfid.core.records import Case
    from lm_eval_toolfid.scoring.outcome import answer_text, score_generation

    tools = [{"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}]
    one = Case(id="one", prompt="p", tools=tools, gold_tool_name="f", gold_arguments={"a": 1})
    two = Case(id="two", prompt="p", tools=tools, gold_calls=[{"name": "f", "arguments": {"a": 1}},
                                                              {"name": "f", "arguments": {"a": 2}}])
    call = '{"name": "f", "arguments": {"a": 1}}'
    runaway = call + '\n{"name": "f", "arguments": {"a": "schema text copied'
    assert answer_text(runaway, one) == call
    assert answer_text(runaway, two) == runaway
    # what follows the first call does not change a single-call case's outcome...
    assert score_generation(runaway, one) == score_generation(call, one)
    assert score_generation(runaway, one).valid
    # ...while a multi-call case sees every call it wrote
    both = call + "\n" + call.replace("1", "2")
    assert score_generation(both, two).n_calls == 2
    assert score_generation(answer_text(both, one), one).n_calls == 1


def test_toolfid_hflm_counts_as_the_hf_backend() -> None:
    """toolfid run's model must pair with `lm_eval --model hf` runs of the same base."""
    from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM
    from lm_eval_toolfid.integrations.lm_eval.task import backend_name

    assert backend_name(ToolfidHFLM.__new__(ToolfidHFLM)) == "hf"
    assert backend_name("vllm") == "vllm"
    assert backend_name(object()) == "object"
