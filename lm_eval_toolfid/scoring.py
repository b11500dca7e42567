"""The scoring core: generation → :class:`Outcome`; two outcomes → :class:`PairScore`;
many pairs → :class:`Summary`. Every entry point (the lm-eval task, ``toolfid run``, ``score``,
``check``, reports) calls these; every metric is defined once, in :data:`METRICS`.

A metric is a per-case *item* (what one case contributes, or None when the case is not in the
metric's denominator) plus an *aggregation* over the defined items. lm-eval receives exactly
these items and aggregations; :func:`summarize` applies the same two functions.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from .parsing import parse_calls
from .stopping import truncate_call
from .records import (
    CallOutcome,
    Case,
    GoldCall,
    Outcome,
    OutcomeKind,
    PairScore,
    Summary,
    ToolCall,
    bounded,
    bounded_text,
)
from .schema import validate_arguments
from .stats import difference_ci, mcnemar_exact_p, mean_defined, paired_difference_ci

log = logging.getLogger("lm_eval.toolfid")

STRING_ARGUMENTS_FLAG = "arguments_string_decoded"


# --- one call ------------------------------------------------------------------------------

def declared_surface(case: Case, task_allowed: Sequence[str] | None = None) -> list[str] | None:
    """The tool surface a call must stay inside: the case's, else the task's, else None (gold rule)."""
    if case.allowed_tools is not None:
        return list(case.allowed_tools)
    return list(task_allowed) if task_allowed is not None else None


def is_hallucinated(name: str, case: Case, task_allowed: Sequence[str] | None = None) -> bool:
    """Name outside the declared surface; when none is declared, not one of the expected tools
    (for an irrelevance case: not one of the offered tools)."""
    surface = declared_surface(case, task_allowed)
    if surface is not None:
        return name not in surface
    if case.irrelevant:
        return name not in case.tool_names
    return name not in {c.name for c in case.expected_calls}


def score_call(call: ToolCall, case: Case, task_allowed: Sequence[str] | None = None,
               string_arguments_valid: bool = True) -> CallOutcome:
    """Check one call's shape, then its arguments against the schema of the tool it names (or,
    when it names no offered tool, the expected tool's — so a renamed but otherwise correct call is
    valid *and* hallucinated; an irrelevance case has no expected tool: ``unknown_tool``)."""
    flags = list(getattr(call, "flags", None) or [])
    surface = getattr(call.surface, "value", call.surface)
    common: dict[str, Any] = {"surface": surface, "flags": flags}
    if not isinstance(call.name, str) or not call.name:
        return CallOutcome(kind=OutcomeKind.WRONG_SHAPE, keyword="name", detail="missing or non-string 'name'",
                           **common)
    name = call.name
    common.update(name=bounded(name), offered=case.tool(name) is not None,
                  hallucinated=is_hallucinated(name, case, task_allowed))
    if STRING_ARGUMENTS_FLAG in flags and not string_arguments_valid:
        return CallOutcome(kind=OutcomeKind.WRONG_SHAPE, keyword="arguments_string",
                           detail="'arguments' is a JSON string, not an object (string_arguments: invalid)",
                           arguments=bounded(call.arguments), **common)
    if isinstance(call.arguments, str):
        return CallOutcome(kind=OutcomeKind.WRONG_SHAPE, keyword="arguments_string",
                           detail="'arguments' is a string, not an object", arguments=bounded(call.arguments),
                           **common)
    if not isinstance(call.arguments, dict):
        return CallOutcome(kind=OutcomeKind.WRONG_SHAPE, keyword="arguments",
                           detail="missing or non-object 'arguments'", arguments=bounded(call.arguments), **common)
    common["arguments"] = bounded(call.arguments)
    tool = case.tool(name) or case.gold_tool
    if tool is None:
        return CallOutcome(kind=OutcomeKind.SCHEMA_ERROR, keyword="unknown_tool",
                           detail=f"no offered tool is named {bounded(name)!r}", **common)
    violation = validate_arguments(call.arguments, tool.parameters)
    if violation is not None:
        where = f" at {violation.path}" if violation.path else ""
        return CallOutcome(kind=OutcomeKind.SCHEMA_ERROR, keyword=violation.keyword,
                           detail=f"{violation.message}{where}", **common)
    return CallOutcome(kind=OutcomeKind.VALID, **common)


# --- gold values ---------------------------------------------------------------------------

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


def _match_all(calls: list[CallOutcome], golds: list[GoldCall]) -> bool:
    """A one-to-one assignment of calls to expected calls where every pair matches (small n)."""
    if len(calls) != len(golds):
        return False
    if not golds:
        return True
    first, rest = golds[0], golds[1:]
    return any(gold_call_matches(c, first) and _match_all(calls[:i] + calls[i + 1:], rest)
               for i, c in enumerate(calls))


# --- one view of one case ------------------------------------------------------------------

def answer_text(text: str, case: Case) -> str:
    """The part of a generation that is scored.

    A case that expects at most one call is answered by the text up to the end of its first
    complete call (:func:`stopping.truncate_call`): what a model writes after that (a repeated
    call, another ``### Tools`` block, schema text) is not part of the answer. This is also exactly
    where a backend that stops at the end of the call stops, so outcomes are identical whether or
    not generation stopped early. A case that expects several calls keeps the whole text. Never
    raises: on a failure the text is kept whole (and scoring records what went wrong).
    """
    if len(case.expected_calls) > 1:
        return text
    try:
        return truncate_call(text)
    except Exception:  # noqa: BLE001 — one case must never end a run
        return text


def score_generation(text: Any, case: Case, task_allowed: Sequence[str] | None = None,
                     string_arguments_valid: bool = True) -> Outcome:
    """Score one generation for one case: every call, then what the case amounts to. Never raises:
    a failure inside scoring becomes a ``malformed`` outcome with keyword ``scoring_error``."""
    text = text if isinstance(text, str) else ("" if text is None else str(text))
    try:
        text = answer_text(text, case)
        return _score_generation(text, case, task_allowed, string_arguments_valid)
    except Exception as exc:  # noqa: BLE001 — one case must never end a run; counted and visible
        log.warning("tool_use_fidelity: scoring failed on case %s: %s: %s", case.id, type(exc).__name__, exc)
        return Outcome(kind=OutcomeKind.MALFORMED, keyword="scoring_error",
                       detail=f"{type(exc).__name__}: {exc}"[:300], attempted=True, text=bounded_text(text),
                       gold_tool=None if case.irrelevant else False,
                       gold_args=False if any(g.has_values for g in case.expected_calls) else None)


def _score_generation(text: str, case: Case, task_allowed: Sequence[str] | None,
                      string_arguments_valid: bool) -> Outcome:
    parsed = parse_calls(text)
    expected = case.expected_calls
    has_gold_values = any(g.has_values for g in expected)
    if not parsed.calls:
        attempted = parsed.malformed  # a broken attempt in any format (JSON, <tool_call>, [TOOL_CALLS], f(…))
        surface = parsed.malformed_formats[0].value if parsed.malformed_formats else None
        return Outcome(kind=OutcomeKind.MALFORMED if attempted else OutcomeKind.NO_CALL, attempted=attempted,
                       surface=surface, text=bounded_text(text), gold_tool=None if case.irrelevant else False,
                       gold_args=False if has_gold_values else None)
    calls = [score_call(c, case, task_allowed, string_arguments_valid) for c in parsed.calls]
    worst = min(calls, key=lambda c: c.kind.rank)
    valid = worst.kind is OutcomeKind.VALID
    names = [c.name for c in calls if isinstance(c.name, str)]
    first = calls[0]
    return Outcome(
        kind=worst.kind, keyword=worst.keyword, detail=worst.detail,
        name=first.name, arguments=first.arguments, surface=first.surface,
        n_calls=len(calls), calls=calls, attempted=True, text=bounded_text(text),
        hallucinated=any(bool(c.hallucinated) for c in calls) if valid else None,
        gold_tool=None if case.irrelevant else Counter(names) == Counter(g.name for g in expected),
        gold_args=_match_all(calls, expected) if has_gold_values else None,
    )


# --- two views of one case -----------------------------------------------------------------

_MISSING = object()


def leaves(obj: Any, path: tuple[Any, ...] = ()) -> Iterable[tuple[tuple[Any, ...], Any]]:
    """``(path, value)`` for every leaf of nested objects *and* arrays (indices are path steps), so
    types are compared at every depth; an empty object or array is itself a leaf."""
    if isinstance(obj, dict) and obj:
        for key, value in obj.items():
            yield from leaves(value, path + (str(key),))
    elif isinstance(obj, list) and obj:
        for i, value in enumerate(obj):
            yield from leaves(value, path + (i,))
    else:
        yield path, obj


def same_value(a: Any, b: Any) -> bool:
    """Equality that keeps JSON types apart (``1`` ≠ ``1.0`` ≠ ``True`` ≠ ``"1"``)."""
    return type(a) is type(b) and a == b


def field_disagreement(base_args: Any, ft_args: Any) -> float:
    """Fraction of leaf paths (union of both) whose values differ or exist on one side only."""
    base_leaves, ft_leaves = dict(leaves(base_args)), dict(leaves(ft_args))
    paths = set(base_leaves) | set(ft_leaves)
    paths.discard(())  # both arguments empty: vacuous agreement
    if not paths:
        return 0.0
    differ = sum(not same_value(base_leaves.get(p, _MISSING), ft_leaves.get(p, _MISSING)) for p in paths)
    return differ / len(paths)


def match_calls(base: list[CallOutcome], ft: list[CallOutcome]) -> list[tuple[Any, Any]]:
    """Pair the two views' calls: same name first (order-insensitive, a multiset), then the rest in
    order; a call left without a partner is paired with nothing (``{}``)."""
    left_base, left_ft, pairs = list(base), list(ft), []
    for call in list(left_ft):
        partner = next((b for b in left_base if b.name == call.name), None)
        if partner is not None:
            pairs.append((partner.arguments, call.arguments))
            left_base.remove(partner)
            left_ft.remove(call)
    for i in range(max(len(left_base), len(left_ft))):
        pairs.append((left_base[i].arguments if i < len(left_base) else {},
                      left_ft[i].arguments if i < len(left_ft) else {}))
    return pairs


def calls_disagreement(base: Outcome, ft: Outcome) -> float:
    """Leaf disagreement over all matched calls (paths prefixed by the pair's index)."""
    pairs = match_calls(base.calls, ft.calls)
    if len(pairs) == 1:
        return field_disagreement(pairs[0][0] or {}, pairs[0][1] or {})
    return field_disagreement({str(i): b or {} for i, (b, _) in enumerate(pairs)},
                              {str(i): f or {} for i, (_, f) in enumerate(pairs)})


def pair(case: Case | str, ft: Outcome, base: Outcome | None, ft_text: str | None = None,
         base_text: str | None = None) -> PairScore:
    """Combine the two views of one case into its record."""
    case_id = case if isinstance(case, str) else case.id
    relevant = True if isinstance(case, str) else not case.irrelevant
    tool = None if isinstance(case, str) else case.gold_tool_name
    disagreement = calls_disagreement(base, ft) if base is not None and ft.valid and base.valid else None
    identical = None
    if base is not None:
        a = ft_text if ft_text is not None else ft.text
        b = base_text if base_text is not None else base.text
        identical = a == b if a is not None and b is not None else None
    return PairScore(case_id=case_id, ft=ft, base=base, relevant=relevant, arg_disagreement=disagreement,
                     identical_output=identical, tool=tool)


# --- metrics: per-case items and their aggregations ----------------------------------------

def rate(items: Sequence[Any]) -> float | None:
    """Mean of the 0/1 (or [0, 1]) items; None when there are none."""
    return mean_defined(items)


def ratio(items: Sequence[Sequence[int]]) -> float | None:
    """Σ numerators / Σ denominators of ``[k, n]`` items; None when Σ n = 0."""
    k = sum(i[0] for i in items)
    n = sum(i[1] for i in items)
    return k / n if n else None


def delta_of_rates(items: Sequence[Sequence[int | None]]) -> float | None:
    """rate(adapter) − rate(base) over ``[adapter, base]`` items (each 0/1/None, own denominators)."""
    ft = mean_defined([i[0] for i in items])
    base = mean_defined([i[1] for i in items])
    if ft is None and base is None:
        return None
    return (ft or 0.0) - (base or 0.0)


def mcnemar(items: Sequence[int]) -> float:
    return mcnemar_exact_p(items)


def _named(o: Outcome) -> list[Any] | None:
    named = [c for c in o.calls if c.hallucinated is not None]
    return [sum(bool(c.hallucinated) for c in named), len(named)] if named else None


def _valid(p: PairScore, o: Outcome | None) -> int | None:
    return int(o.valid) if o is not None and p.relevant else None


def _parsed(p: PairScore, o: Outcome | None) -> int | None:
    return int(o.kind.parsed) if o is not None and p.relevant else None


def _halluc(o: Outcome | None) -> int | None:
    return int(bool(o.hallucinated)) if o is not None and o.valid else None


def _opt(value: bool | None) -> int | None:
    return None if value is None else int(value)


def _false_call(p: PairScore, o: Outcome | None) -> int | None:
    return int(o.attempted) if o is not None and not p.relevant else None


def _both(item: Callable[[PairScore, Outcome | None], Any]) -> Callable[[PairScore], Any]:
    def both(p: PairScore) -> Any:
        if p.base is None:
            return None
        ft, base = item(p, p.ft), item(p, p.base)
        return None if ft is None and base is None else [ft, base]
    return both


def _tool_choice_change(p: PairScore) -> int | None:
    if p.base is None:
        return None
    views = (p.ft, p.base)
    if not all(o.calls and all(c.offered for c in o.calls) for o in views):
        return None
    return int(Counter(c.name for c in p.ft.calls) != Counter(c.name for c in p.base.calls))


def _format_drift(p: PairScore) -> int | None:
    if p.base is None or not (p.ft.kind.parsed and p.base.kind.parsed):
        return None
    return int(p.ft.surface != p.base.surface)


@dataclass(frozen=True)
class Metric:
    name: str
    item: Callable[[PairScore], Any]
    aggregate: Callable[[Sequence[Any]], float | None]
    higher_is_better: bool
    paired: bool
    kind: str
    """``rate``: mean of 0/1 items (lm-eval reports its standard error); ``custom``: see aggregate."""
    doc: str


def _m(name: str, item: Callable[[PairScore], Any], higher: bool, paired: bool, doc: str,
       aggregate: Callable[[Sequence[Any]], float | None] = rate, kind: str = "rate") -> Metric:
    return Metric(name, item, aggregate, higher, paired, kind, doc)


def _base(fn: Callable[[PairScore, Outcome | None], Any]) -> Callable[[PairScore], Any]:
    return lambda p: fn(p, p.base) if p.base is not None else None


METRICS: tuple[Metric, ...] = (
    _m("json_valid_rate", lambda p: _valid(p, p.ft), True, False,
       "cases (expecting a call) whose calls are all well-formed and schema-valid"),
    _m("parse_rate", lambda p: _parsed(p, p.ft), True, False, "cases (expecting a call) where a call was parsed"),
    _m("hallucination_rate", lambda p: _halluc(p.ft), False, False,
       "over valid cases: some call names a tool outside the declared surface (the original definition)"),
    _m("name_hallucination_rate", lambda p: _named(p.ft), False, False,
       "over every call that names a tool, valid or not: the name is outside the declared surface",
       aggregate=ratio, kind="custom"),
    _m("gold_tool_rate", lambda p: _opt(p.ft.gold_tool) if p.relevant else None, True, False,
       "cases whose called tools are exactly the expected ones"),
    _m("gold_args_match_rate", lambda p: _opt(p.ft.gold_args), True, False,
       "cases with gold values: every expected call made with the expected values"),
    _m("false_call_rate", lambda p: _false_call(p, p.ft), False, False,
       "irrelevance cases: a call was attempted (a malformed attempt counts)"),
    _m("base_json_valid_rate", _base(_valid), True, True, "the paired base's json_valid_rate"),
    _m("base_parse_rate", _base(_parsed), True, True, "the paired base's parse_rate"),
    _m("base_hallucination_rate", lambda p: _halluc(p.base), False, True, "the paired base's hallucination_rate"),
    _m("base_name_hallucination_rate", lambda p: _named(p.base) if p.base is not None else None, False, True,
       "the paired base's name_hallucination_rate", aggregate=ratio, kind="custom"),
    _m("base_gold_tool_rate", lambda p: _opt(p.base.gold_tool) if p.base is not None and p.relevant else None,
       True, True, "the paired base's gold_tool_rate"),
    _m("base_gold_args_match_rate", lambda p: _opt(p.base.gold_args) if p.base is not None else None, True, True,
       "the paired base's gold_args_match_rate"),
    _m("base_false_call_rate", _base(_false_call), False, True, "the paired base's false_call_rate"),
    _m("validity_delta", lambda p: p.validity_delta, True, True,
       "mean over cases of (adapter valid − base valid); lm-eval's stderr is the paired standard error"),
    _m("validity_mcnemar_p", lambda p: p.validity_delta, True, True,
       "exact two-sided McNemar p-value of the validity change", aggregate=mcnemar, kind="custom"),
    _m("arg_disagreement", lambda p: p.arg_disagreement, False, True,
       "over cases where both views are valid: fraction of leaf fields (any depth, types kept apart) that differ"),
    _m("hallucination_delta", _both(lambda p, o: _halluc(o)), False, True,
       "hallucination_rate(adapter) − hallucination_rate(base), each over its own valid cases",
       aggregate=delta_of_rates, kind="custom"),
    _m("tool_choice_change_rate", _tool_choice_change, False, True,
       "cases where both views call offered tools, but not the same ones"),
    _m("identical_output_rate", lambda p: _opt(p.identical_output), True, True,
       "cases whose adapter generation is byte-identical to the base's"),
    _m("format_drift_rate", _format_drift, False, True,
       "cases where both views made a call, in different surface formats"),
    _m("false_call_delta", _both(_false_call), False, True,
       "false_call_rate(adapter) − false_call_rate(base)", aggregate=delta_of_rates, kind="custom"),
)
METRIC_BY_NAME = {m.name: m for m in METRICS}


def case_items(p: PairScore) -> dict[str, Any]:
    """What one case contributes to each metric (metrics whose item is None are left out)."""
    items = {}
    for metric in METRICS:
        if metric.paired and p.base is None:
            continue
        value = metric.item(p)
        if value is not None:
            items[metric.name] = value
    return items


def outcome_counts(outcomes: Iterable[Outcome]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for o in outcomes:
        counts[o.kind.value + (f":{o.keyword}" if o.keyword else "")] += 1
    return dict(sorted(counts.items()))


def summarize(pairs: Sequence[PairScore]) -> Summary:
    """Aggregate scored pairs into the run's metrics — the same items and aggregations lm-eval uses."""
    n = len(pairs)
    paired = bool(n) and all(p.base is not None for p in pairs)
    per_case = [case_items(p) for p in pairs]
    metrics: dict[str, float | None] = {}
    denominators: dict[str, int] = {}
    for metric in METRICS:
        if metric.paired and not paired:
            continue
        items = [c[metric.name] for c in per_case if metric.name in c]
        metrics[metric.name] = metric.aggregate(items) if items else None
        denominators[metric.name] = len(items)
    fields: dict[str, Any] = {}
    if paired:
        relevant = [p for p in pairs if p.relevant]
        deltas = [p.validity_delta for p in relevant]
        base_valid = [int(p.base.valid) for p in relevant if p.base is not None]
        ft_h = [x for x in (_halluc(p.ft) for p in pairs) if x is not None]
        base_h = [x for x in (_halluc(p.base) for p in pairs) if x is not None]
        fields.update(
            validity_delta_ci=paired_difference_ci(deltas, base_valid),
            hallucination_delta_ci=difference_ci(sum(ft_h), len(ft_h), sum(base_h), len(base_h)),
            validity_discordant=(sum(1 for d in deltas if d is not None and d < 0),
                                 sum(1 for d in deltas if d is not None and d > 0)),
            base_outcome_counts=outcome_counts(p.base for p in pairs if p.base is not None),
        )
    return Summary(
        n=n, n_relevant=sum(p.relevant for p in pairs), n_irrelevant=sum(not p.relevant for p in pairs),
        metrics=metrics, denominators=denominators, outcome_counts=outcome_counts(p.ft for p in pairs),
        paired=paired, **fields,
    )
