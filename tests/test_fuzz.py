"""Fuzzing the whole path a generation takes: parse → score → ``model_dump(mode="json")`` →
``json.dumps`` (and pydantic's own JSON writer). No exception may escape, no RecursionError,
and every case stays fast (asserted generously here; ``bench/bench_fuzz_corpus.py`` measures).

The example count comes from a settings profile (``TOOLFID_FUZZ_PROFILE=ci`` by default: a few
hundred examples per test, derandomised so CI is reproducible; ``deep`` for long local runs).
"""

from __future__ import annotations

import json
import keyword
import os
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lm_eval_toolfid.formats import FORMATS, REGISTRY, driver, parse_calls, render_call, render_calls
from lm_eval_toolfid.scoring.outcome import score_generation

from .conftest import make_case

settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("deep", max_examples=int(os.environ.get("TOOLFID_FUZZ_EXAMPLES", "5000")), deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("TOOLFID_FUZZ_PROFILE", "ci"))

CASE = make_case()
PER_CASE_LIMIT_S = 1.0  # generous: the real target (≤ 50 ms) is measured by the benchmark


@pytest.fixture(autouse=True)
def _strict_parser(monkeypatch):
    monkeypatch.setattr(driver, "RAISE_INTERNAL_ERRORS", True)


def run_pipeline(text: str) -> None:
    start = time.perf_counter()
    parsed = parse_calls(text)
    outcome = score_generation(text, CASE)
    json.dumps(outcome.model_dump(mode="json"))
    outcome.model_dump_json()
    json.dumps(parsed.model_dump(mode="json"))
    elapsed = time.perf_counter() - start
    assert elapsed < PER_CASE_LIMIT_S, (elapsed, text[:200])
    assert not hasattr(sys, "TOOLFID_PWNED")


# --- strategies -------------------------------------------------------------------------------

names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}(\.[a-z_][a-z0-9_]{0,8})?", fullmatch=True).filter(
    lambda n: not any(keyword.iskeyword(p) for p in n.split(".")))
keys = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True).filter(lambda k: not keyword.iskeyword(k))
scalars = (st.none() | st.booleans() | st.integers(-10**30, 10**30)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12)
arguments = st.dictionaries(keys, values, max_size=4)
calls = st.lists(st.tuples(names, arguments), min_size=1, max_size=3)

SPECIALS = ['{', '}', '[', ']', '"', '\\', ',', ':', '\n', '<', '>', '(', ')', '=', ";", "'", "\ud800",
            "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<function=", "</function>",
            "<parameter=", "</parameter>", "```", "NaN", "Infinity", "9" * 5000, '{"name":', '"arguments":',
            "__import__('os')", "exec('import sys; sys.TOOLFID_PWNED = 1')"]
HOSTILE_EXPR = ["__import__('os').system('true')", "exec('import sys; sys.TOOLFID_PWNED = 1')", "x", "1+2",
                "{1, 2}", "b'x'", "1j", "lambda: 1", "[i for i in y]", "f()", "(yield)", "*a", "...",
                "[" * 300 + "]" * 300, "{'k': " * 100 + "1" + "}" * 100, "-" * 1000 + "1", "1e999", "-1e999"]


@st.composite
def broken_renderings(draw) -> str:
    """A real rendering in some format, then broken: truncated, spliced, duplicated, wrapped."""
    fmt = draw(st.sampled_from(FORMATS))
    call_list = draw(calls)
    markers = draw(st.booleans())
    try:
        text = render_calls(call_list, fmt, markers=markers)
    except ValueError:
        text = render_call(call_list[0][0], call_list[0][1], "bare_json")
    for _ in range(draw(st.integers(0, 4))):
        how = draw(st.sampled_from(["truncate", "insert", "delete", "duplicate", "wrap", "nest", "swap"]))
        at = draw(st.integers(0, len(text)))
        if how == "truncate":
            text = text[:at]
        elif how == "insert":
            text = text[:at] + draw(st.sampled_from(SPECIALS)) + text[at:]
        elif how == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 5)):]
        elif how == "duplicate":
            text = text * draw(st.integers(2, 50))
        elif how == "wrap":
            text = draw(st.text(max_size=30)) + text + draw(st.text(max_size=30))
        elif how == "nest":
            n = draw(st.integers(1, 3000))
            text = draw(st.sampled_from(["{", "[", '{"a":', "<tool_call>", "f(a="])) * n + text
        else:
            text = text[at:] + text[:at]
    return text


@st.composite
def bombs(draw) -> str:
    piece = draw(st.sampled_from(SPECIALS + ["{}", "[]", '{"a":[', "x{", '"{', '{"', "[{", "}]", "f(a=",
                                             "<tool_call>{", "[TOOL_CALLS]f{"]))
    n = draw(st.integers(1, 70_000 // max(1, len(piece))))
    tail = draw(st.sampled_from(["", '{"name": "get_weather", "arguments": {"city": "Paris"}}', "}" * 100]))
    return piece * n + tail


@st.composite
def hostile_pythonic(draw) -> str:
    name = draw(names)
    expr = draw(st.sampled_from(HOSTILE_EXPR))
    return draw(st.sampled_from(["{n}(a={e})", "[{n}(a={e})]", "[{n}(b=1), {n}(a={e})]", "<|python_tag|>{n}(a={e})",
                                 "```python\n[{n}(a={e})]\n```"])).format(n=name, e=expr)


# --- properties -------------------------------------------------------------------------------

@given(st.text(alphabet=st.characters(blacklist_categories=()), max_size=400))
def test_arbitrary_unicode_text_including_lone_surrogates(text):
    run_pipeline(text)


@given(broken_renderings())
def test_every_format_broken_in_every_way(text):
    run_pipeline(text)


@given(bombs())
def test_bombs_up_to_the_scan_cap(text):
    run_pipeline(text)


@given(hostile_pythonic())
def test_non_literal_pythonic_is_malformed_and_never_executed(text):
    parsed = parse_calls(text)
    assert parsed.calls == [] and parsed.malformed, text[:200]
    run_pipeline(text)


@given(values)
def test_any_json_value_as_arguments_or_as_the_whole_text(value):
    run_pipeline(json.dumps({"name": "get_weather", "arguments": value}))
    run_pipeline(json.dumps(value))


@given(calls, st.sampled_from(FORMATS), st.booleans())
def test_round_trip_random_calls_in_every_format(call_list, fmt, markers):
    if not REGISTRY[fmt].has_markers and not markers:
        markers = True
    try:
        text = render_calls(call_list, fmt, markers=markers)
    except ValueError:  # pythonic_bare writes a single call
        call_list = call_list[:1]
        text = render_calls(call_list, fmt, markers=markers)
    got = [(c.name, c.arguments) for c in parse_calls(text).calls]
    assert json.dumps(got, sort_keys=True) == json.dumps(call_list, sort_keys=True), text[:500]
