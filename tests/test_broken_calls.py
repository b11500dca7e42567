"""A call whose outer object does not parse (truncated, unbalanced, a syntax error inside) is ``malformed``,
never ``wrong_shape`` from an object found inside it; JSON written on its own in prose stays what it is.

Every call here is a real rendering (:func:`render_call` / :func:`render_calls`, the same writers the format
tests and the bundled fixture adapters use) of fixture case ``fx-000``'s expected call, cut at every point
inside its outer structure."""

from __future__ import annotations

import json

import pytest

from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.cli import main
from lm_eval_toolfid.core.records import OutcomeKind
from lm_eval_toolfid.formats import FORMATS, parse_calls, render_call, render_calls
from lm_eval_toolfid.formats.scan import first_span_at
from lm_eval_toolfid.scoring.check import check_text
from lm_eval_toolfid.scoring.outcome import score_generation

CASE = next(c for c in load_cases("fixture") if c.id == "fx-000")
NAME, ARGS = CASE.expected_calls[0].name, dict(CASE.expected_calls[0].arguments or {})
TWO = [(NAME, ARGS), (NAME, {**ARGS, "city": "Kyoto"})]
BROKEN_OUTER = '{"name": "get_weather", "arguments": {"city": "Osaka"}'  # outer brace never closed
# formats whose payload is one bracketed structure (JSON object/array, Python call list): cut inside it,
# the call is broken; qwen_xml reads a missing closing tag as ending at the next tag or the end of the text
BRACKETED = [f for f in FORMATS if f != "qwen_xml"]


def _payload(text: str) -> tuple[int, int]:
    """Where the call's outer bracket opens and just past where it closes (markers and prose around it left out)."""
    marker_free = text.replace("[TOOL_CALLS]", " " * len("[TOOL_CALLS]")).replace("[ARGS]", " " * len("[ARGS]"))
    if "(" in marker_free and (marker_free.find("(") < marker_free.find("{") or "{" not in marker_free):
        start = marker_free.find("[") if marker_free.lstrip().startswith("[") else marker_free.find("(")
        if start == marker_free.find("("):
            return start, marker_free.rfind(")") + 1
    else:
        start = min(i for i in (marker_free.find("{"), marker_free.find("[")) if i != -1)
    span = first_span_at(marker_free, start)
    assert span is not None, text
    return start, span.end


def _cuts(text: str) -> list[str]:
    """Every prefix that ends inside the call's outer structure, from its first ``{`` or ``(`` on (``[`` alone,
    or ``[get_weather``, is not yet a call of any shape)."""
    start, end = _payload(text)
    first = min(i for i in (text.find("{", start), text.find("(", start)) if i != -1)
    return [text[:i] for i in range(first + 1, end)]


def test_the_issue_example_is_malformed_in_check_and_in_scoring(capsys):
    assert score_generation(BROKEN_OUTER, CASE).kind is OutcomeKind.MALFORMED
    assert check_text(BROKEN_OUTER, CASE).as_dict()["kind"] == "malformed"
    code = main(["check", "--cases", "fixture", "--case", "fx-000", BROKEN_OUTER])
    out = capsys.readouterr().out
    assert code == 1 and "MALFORMED" in out and "WRONG_SHAPE" not in out, out


@pytest.mark.parametrize("fmt", BRACKETED)
@pytest.mark.parametrize("markers", [True, False])
def test_every_cut_inside_a_call_is_malformed(fmt, markers):
    full = render_call(NAME, ARGS, fmt, markers=markers)
    assert score_generation(full, CASE).kind is OutcomeKind.VALID, full  # the whole call is valid
    cuts = _cuts(full)
    assert len(cuts) > 10
    wrong = [(cut, score_generation(cut, CASE).kind.value) for cut in cuts
             if score_generation(cut, CASE).kind is not OutcomeKind.MALFORMED]
    assert not wrong, wrong[:3]


@pytest.mark.parametrize("fmt", ["bare_json", "fenced", "mistral", "openai", "openai_function",
                                 "openai_string_args", "pythonic"])
def test_a_truncated_list_of_calls_is_malformed_not_its_first_call(fmt):
    full = render_calls(TWO, fmt)
    assert len(parse_calls(full).calls) == 2
    wrong = [(cut, kind) for cut in _cuts(full) if (kind := parse_calls(cut)).calls or not kind.malformed]
    assert not wrong, wrong[:3]


def test_qwen_xml_cut_inside_its_function_tag_is_malformed_and_never_wrong_shape():
    full = render_call(NAME, ARGS, "qwen_xml")
    tag_end = full.index(">", full.index("<function=")) + 1
    for i in range(1, len(full)):
        kind = score_generation(full[:i], CASE).kind
        assert kind is not OutcomeKind.WRONG_SHAPE, full[:i]
        if full.index("<function=") < i < tag_end:
            assert kind is OutcomeKind.MALFORMED, full[:i]


@pytest.mark.parametrize("broken", [
    '{"name": "get_weather" "arguments": {"city": "Osaka"}}',  # a missing comma
    '{"name": "get_weather", "arguments": {"city": "Osaka",}}',  # a trailing comma
    "{'name': 'get_weather', 'arguments': {\"city\": \"Osaka\"}}",  # Python quotes around JSON arguments
    '{"name": "get_weather", "arguments": {"city": "Osaka"}]}',  # a closer that does not match
    '[{"name": "get_weather", "arguments": {"city": "Osaka"}} {"name": "x", "arguments": {}}]',  # no comma
])
@pytest.mark.parametrize("wrap", ["{}", "```json\n{}\n```", "<tool_call>\n{}\n</tool_call>", "[TOOL_CALLS]{}",
                                  "I'll check. {}"])
def test_a_syntax_error_inside_the_outer_object_is_malformed(broken, wrap):
    text = wrap.replace("{}", broken)
    outcome = score_generation(text, CASE)
    assert outcome.kind is OutcomeKind.MALFORMED, (text, outcome.kind, outcome.keyword)


def test_json_written_on_its_own_is_still_read():
    # an object in prose that is not a call: wrong shape (it is whole)
    assert score_generation('Use {"city": "Osaka"} please', CASE).kind is OutcomeKind.WRONG_SHAPE
    assert score_generation('{"city": "Osaka"}', CASE).kind is OutcomeKind.WRONG_SHAPE
    # a whole call after prose braces that never close, or a stray quote: the call is found
    call = json.dumps({"name": NAME, "arguments": ARGS})
    for text in (f'He said "hi {{" and then {call}', f"Step {{1: {call}", f"Here: {{x}} {call}"):
        assert [c.name for c in parse_calls(text).calls] == [NAME], text
    # a complete call followed by a truncated repetition is the call (a one-call case is cut after it)
    assert score_generation(call + " " + BROKEN_OUTER, CASE).kind is OutcomeKind.VALID
    # a broken object, then the call written whole: the whole call is the answer
    broken = '{"name": "get_weather" "arguments": {"city": "Osaka"}}'
    assert [c.name for c in parse_calls(f"I'll call {broken}\nSorry: {call}").calls] == [NAME]
