"""Result grounding: which expected argument values come from a tool result, and does a call reproduce them?

A case with a history carries recorded tool results; the next call often has to use a value from one
(an id, a price, a name the search returned). An expected value *comes from a result* when it is a
string or a number that appears in some ``tool`` turn's content and in none of the user's turns (the
request and later user turns), matched case-insensitively as a whole token (``"12"`` does not match
``"123"``, ``"on"`` does not match ``"Boston"``). Booleans and values of single-turn cases never count.

:func:`result_grounding` gives (reproduced, expected) for one view: a value is reproduced when a call
to the expected tool carries it at the same argument path (array positions ignored; numbers by value,
strings trimmed, as gold values compare). BFCL-style ``options`` count per parameter: a parameter
whose acceptable values include one from a result is reproduced when the call's value is acceptable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from lm_eval_toolfid.core.records import CallOutcome, Case
from lm_eval_toolfid.scoring.gold import option_matches, values_equal


@dataclass(frozen=True)
class ResultValue:
    """One expected value that comes from a tool result."""

    tool: str
    """The expected call it belongs to."""
    path: tuple[str, ...]
    """Its argument path, array positions left out."""
    value: Any
    options: tuple[Any, ...] | None = None
    """For BFCL-style options: every acceptable value of the parameter (``path`` is the parameter)."""


def _forms(value: Any) -> list[str]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        return [text] if text else []
    if isinstance(value, int):
        return [str(value)]
    if isinstance(value, float):
        return [repr(value)] + ([str(int(value))] if value.is_integer() else [])
    return []


def _token_pattern(form: str) -> re.Pattern[str]:
    head = r"(?<![\w.])" if form[0].isalnum() or form[0] == "_" else ""
    tail = r"(?![\w]|\.\d)" if form[-1].isalnum() or form[-1] == "_" else ""
    return re.compile(head + re.escape(form) + tail, re.IGNORECASE)


def appears_in(value: Any, texts: Iterable[str]) -> bool:
    """``value`` (a string or number) appears as a whole token in one of ``texts``."""
    patterns = [_token_pattern(f) for f in _forms(value)]
    return any(p.search(t) for p in patterns for t in texts)


def _leaves(obj: Any, path: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], Any]]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _leaves(value, path + (str(key),))
    elif isinstance(obj, list):
        for value in obj:
            yield from _leaves(value, path)
    else:
        yield path, obj


def result_values(case: Case) -> list[ResultValue]:
    """The expected argument values of ``case`` that come from a tool result (empty for a single-turn case)."""
    if not case.history:
        return []
    results = [m.content or "" for m in case.history if m.role == "tool"]
    said = [case.prompt] + [m.content or "" for m in case.history if m.role == "user"]

    def from_result(value: Any) -> bool:
        return bool(_forms(value)) and appears_in(value, results) and not appears_in(value, said)

    out: list[ResultValue] = []
    for gold in case.expected_calls:
        if gold.arguments is not None:
            out += [ResultValue(gold.name, path, value) for path, value in _leaves(gold.arguments)
                    if from_result(value)]
        elif gold.options is not None:
            for param, acceptable in gold.options.items():
                if any(from_result(v) for v in acceptable if not isinstance(v, (dict, list))):
                    out.append(ResultValue(gold.name, (param,), None, tuple(acceptable)))
    return out


def _reproduces(call: CallOutcome, wanted: ResultValue) -> bool:
    if call.name != wanted.tool or not isinstance(call.arguments, dict):
        return False
    if wanted.options is not None:
        param = wanted.path[0]
        return param in call.arguments and any(option_matches(call.arguments[param], o) for o in wanted.options
                                               if o != "")
    return any(path == wanted.path and values_equal(value, wanted.value) for path, value in _leaves(call.arguments))


def result_grounding(calls: list[CallOutcome], case: Case) -> tuple[int, int] | None:
    """(reproduced, expected) over the case's result-derived expected values; None when it has none."""
    wanted = result_values(case)
    if not wanted:
        return None
    return sum(any(_reproduces(c, w) for c in calls) for w in wanted), len(wanted)
