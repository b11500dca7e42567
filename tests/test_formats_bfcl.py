"""BFCL round trip: every reference answer (real data nobody here wrote), rendered in every
format, with and without special-token markers, parses back to the same calls."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from lm_eval_toolfid.formats import FORMATS, REGISTRY, driver, parse_calls, render_calls

from .conftest import SHARED

ANSWERS = SHARED / "bfcl" / "possible_answer"
pytestmark = pytest.mark.skipif(not ANSWERS.is_dir(), reason="../shared/bfcl not present")


def first_option(options):
    """The first acceptable value of a parameter; dict values hold option lists themselves."""
    option = options[0] if isinstance(options, list) and options else options
    if isinstance(option, dict):
        return {k: first_option(v) for k, v in option.items()
                if not (isinstance(v, list) and v and v[0] == "")}
    return option


def reference_calls(answer):
    calls = []
    for item in answer["ground_truth"]:
        (name, params), = item.items()
        calls.append((name, {p: first_option(opts) for p, opts in params.items() if opts and opts[0] != ""}))
    return calls


def canonical(calls):
    return json.dumps(calls, sort_keys=True)


def test_bfcl_reference_answers_round_trip_in_every_format(monkeypatch):
    monkeypatch.setattr(driver, "RAISE_INTERNAL_ERRORS", True)
    files = sorted(ANSWERS.glob("*.json"))
    assert files
    tried: Counter = Counter()
    inexpressible: Counter = Counter()
    failures = []
    n_answers = n_calls = 0
    for path in files:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            answer = json.loads(line)
            calls = reference_calls(answer)
            n_answers += 1
            n_calls += len(calls)
            for fmt in FORMATS:
                for markers in ([True, False] if REGISTRY[fmt].has_markers else [True]):
                    try:
                        text = render_calls(calls, fmt, markers=markers)
                    except ValueError:
                        inexpressible[fmt] += 1
                        continue
                    tried[fmt] += 1
                    got = [(c.name, c.arguments) for c in parse_calls(text).calls]
                    if canonical(got) != canonical(calls):
                        failures.append((answer["id"], fmt, markers, text[:200], got))
    print(f"\nBFCL round trip: {n_answers} answers, {n_calls} calls, {sum(tried.values())} renderings parsed back")
    print("per format:", dict(tried))
    print("not expressible (skipped):", dict(inexpressible))
    assert n_answers >= 1000
    assert not failures, failures[:5]
    # pythonic cannot write Python keywords as argument names; every other format writes everything
    assert set(inexpressible) <= {"pythonic", "pythonic_bare"}
    assert all(tried[f] > 0.9 * n_answers for f in FORMATS if f != "pythonic_bare")
