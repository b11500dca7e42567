"""Gold values: does a call carry the expected values? (``gold_args``; BFCL-style options.)

Numbers compare by value (``1 == 1.0``), a boolean is never a number, strings ignore outer
whitespace; an options map lists acceptable values per parameter (``""``: may be omitted, a dict
option is a nested options map, a list option is compared element-wise).
"""

from __future__ import annotations

from typing import Any

from lm_eval_toolfid.core.records import CallOutcome, GoldCall


def values_equal(a: Any, b: Any) -> bool:
    """JSON-value equality for correctness checks: numbers compare by value (``1 == 1.0``), but a
    boolean is never a number, containers compare element-wise, strings ignore outer whitespace."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, str) and isinstance(b, str):
        return a.strip() == b.strip()
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _is_options_map(option: Any) -> bool:
    return isinstance(option, dict) and bool(option) and all(isinstance(v, list) for v in option.values())


def option_matches(value: Any, option: Any) -> bool:
    """One acceptable value (BFCL style): a nested options map, an element-wise list, or a literal."""
    if _is_options_map(option) and isinstance(value, dict):
        return options_match(value, option)
    if isinstance(option, list) and isinstance(value, list):
        return len(option) == len(value) and all(option_matches(v, o) for v, o in zip(value, option))
    return values_equal(value, option)


def options_match(arguments: dict[str, Any], options: dict[str, list[Any]]) -> bool:
    """Every argument is a known parameter with an acceptable value; every parameter left out may be
    (``""`` among its options)."""
    for key, value in arguments.items():
        if key not in options or not any(option_matches(value, o) for o in options[key]):
            return False
    return all(key in arguments or "" in opts for key, opts in options.items())


def gold_call_matches(call: CallOutcome, gold: GoldCall) -> bool:
    if call.name != gold.name or not isinstance(call.arguments, dict):
        return False
    if gold.arguments is not None:
        return values_equal(call.arguments, gold.arguments)
    if gold.options is not None:
        return options_match(call.arguments, gold.options)
    return True


def match_gold_calls(calls: list[CallOutcome], golds: list[GoldCall]) -> bool:
    """A one-to-one assignment of calls to expected calls where every pair matches (small n)."""
    if len(calls) != len(golds):
        return False
    if not golds:
        return True
    first, rest = golds[0], golds[1:]
    return any(gold_call_matches(c, first) and match_gold_calls(calls[:i] + calls[i + 1:], rest)
               for i, c in enumerate(calls))

