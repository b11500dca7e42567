"""Every metric, defined once: a per-case *item* plus an *aggregation* (:data:`METRICS`).

A metric's item is what one case contributes (None when the case is not in its denominator).
lm-eval receives exactly these items and aggregations; :func:`summarize` applies the same two
functions for ``toolfid run``, ``score``, ``check`` and the reports.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from lm_eval_toolfid.core.records import Outcome, PairScore, Summary
from lm_eval_toolfid.core.stats import difference_ci, mcnemar_exact_p, mean_defined, paired_difference_ci


def rate(items: Sequence[Any]) -> float | None:
    """Mean of the 0/1 (or [0, 1]) items; None when there are none."""
    return mean_defined(items)


def ratio(items: Sequence[Sequence[int]]) -> float | None:
    """Σ numerators / Σ denominators of ``[k, n]`` items; None when Σ n = 0."""
    k = sum(i[0] for i in items)
    n = sum(i[1] for i in items)
    return k / n if n else None


def delta_of_rates(items: Sequence[Sequence[int | None]]) -> float | None:
    """rate(adapter) − rate(base) over ``[adapter, base]`` items (each 0/1/None, own denominators).

    None when either rate is undefined (no case in that view's denominator): a difference with an
    undefined side is undefined, never ``0 − base`` (an adapter with no valid call would otherwise get
    ``hallucination_delta = −base`` and look best on a leaderboard)."""
    ft = mean_defined([i[0] for i in items])
    base = mean_defined([i[1] for i in items])
    if ft is None or base is None:
        return None
    return ft - base


DELTA_OF_RATES: dict[str, tuple[str, str]] = {
    "hallucination_delta": ("hallucination_rate", "base_hallucination_rate"),
    "false_call_delta": ("false_call_rate", "base_false_call_rate"),
}
"""The paired metrics that are a difference of two per-view rates: (adapter's rate, base's rate). Each is
absent whenever either rate is (see :func:`delta_of_rates`); readers of older results files use this to
drop a delta written before that rule (``reporting.results.row_from_results``)."""


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
    if p.primed:  # the prompt started a call: an attempt says nothing about the model
        return None
    return int(o.attempted) if o is not None and not p.relevant else None


def _grounding(o: Outcome | None) -> list[int] | None:
    return list(o.result_grounding) if o is not None and o.result_grounding is not None else None


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
    higher_is_better: bool | None
    """The direction a leaderboard sorts by; None where neither direction means better (a p-value, a share of
    identical outputs: 1.0 can mean "kept everything" or "was not applied")."""
    paired: bool
    kind: str
    """``rate``: mean of 0/1 items (lm-eval reports its standard error); ``custom``: see aggregate."""
    doc: str


def _m(name: str, item: Callable[[PairScore], Any], higher: bool | None, paired: bool, doc: str,
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
    _m("result_grounding_rate", lambda p: _grounding(p.ft), True, False,
       "of the expected argument values that come from a tool result in the history, the share the calls "
       "reproduce", aggregate=ratio, kind="custom"),
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
    _m("base_result_grounding_rate", lambda p: _grounding(p.base), True, True,
       "the paired base's result_grounding_rate", aggregate=ratio, kind="custom"),
    _m("validity_delta", lambda p: p.validity_delta, True, True,
       "mean over cases of (adapter valid − base valid); lm-eval's stderr is the paired standard error"),
    _m("validity_mcnemar_p", lambda p: p.validity_delta, None, True,
       "exact two-sided McNemar p-value of the validity change", aggregate=mcnemar, kind="custom"),
    _m("arg_disagreement", lambda p: p.arg_disagreement, False, True,
       "over cases where both views are valid: fraction of leaf fields (any depth, types kept apart) that differ"),
    _m("hallucination_delta", _both(lambda p, o: _halluc(o)), False, True,
       "hallucination_rate(adapter) − hallucination_rate(base), each over its own valid cases",
       aggregate=delta_of_rates, kind="custom"),
    _m("tool_choice_change_rate", _tool_choice_change, False, True,
       "cases where both views call offered tools, but not the same ones"),
    _m("identical_output_rate", lambda p: _opt(p.identical_output), None, True,
       "cases whose adapter generation is byte-identical to the base's"),
    _m("format_drift_rate", _format_drift, False, True,
       "cases where both views made a call, in different surface formats"),
    _m("false_call_delta", _both(_false_call), False, True,
       "false_call_rate(adapter) − false_call_rate(base)", aggregate=delta_of_rates, kind="custom"),
)
METRIC_BY_NAME = {m.name: m for m in METRICS}


def higher_is_better_map() -> dict[str, bool]:
    """lm-eval's ``higher_is_better`` for the metrics that have a direction (the others are left out)."""
    return {m.name: m.higher_is_better for m in METRICS if m.higher_is_better is not None}


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


def surface_key(kind: Any, surface: str | None) -> str:
    """How one view wrote one case: the first call's surface format, ``malformed[:<format>]`` for a
    broken attempt, ``none`` when nothing call-like was written. Takes an :class:`OutcomeKind` or
    its value (records read back from samples files hold the values)."""
    kind = getattr(kind, "value", kind)
    if kind == "no_call":
        return "none"
    if kind == "malformed":
        return f"malformed:{surface}" if surface else "malformed"
    return str(surface or "unknown")


def surface_counts(outcomes: Iterable[Outcome]) -> dict[str, int]:
    return dict(sorted(Counter(surface_key(o.kind, o.surface) for o in outcomes).items()))


def off_format_rate(outcomes: Iterable[Outcome], expected: str) -> float | None:
    """Over cases where a call was parsed: the share written in another surface format than ``expected``
    (e.g. fenced or bare JSON where the chat template asks for ``<tool_call>``); None when none parsed."""
    parsed = [o for o in outcomes if o.kind.parsed]
    return sum(o.surface != expected for o in parsed) / len(parsed) if parsed else None


SINGLE_TURN = "1"
MULTI_TURN = "2+"
DEPTHS: tuple[tuple[str, Callable[[int], bool]], ...] = (
    (SINGLE_TURN, lambda d: d <= 1), ("2", lambda d: d == 2), ("3+", lambda d: d >= 3), (MULTI_TURN, lambda d: d >= 2),
)
"""Turn-depth buckets of :attr:`Summary.by_depth`; ``"2+"`` is every multi-turn case."""


def summarize_by_depth(pairs: Sequence[PairScore]) -> dict[str, Summary] | None:
    """The summary of each turn-depth bucket that has cases; None when no case has a history."""
    if not any(p.turn_depth >= 2 for p in pairs):
        return None
    out = {}
    for label, within in DEPTHS:
        subset = [p for p in pairs if within(p.turn_depth)]
        if subset:
            out[label] = summarize(subset, by_depth=False)
    return out


def summarize(pairs: Sequence[PairScore], by_depth: bool = True) -> Summary:
    """Aggregate scored pairs into the run's metrics — the same items and aggregations lm-eval uses
    (and, when some case has a history, the same per turn depth: :attr:`Summary.by_depth`)."""
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
            base_surface_counts=surface_counts(p.base for p in pairs if p.base is not None),
        )
    return Summary(
        n=n, n_relevant=sum(p.relevant for p in pairs), n_irrelevant=sum(not p.relevant for p in pairs),
        metrics=metrics, denominators=denominators, outcome_counts=outcome_counts(p.ft for p in pairs),
        surface_counts=surface_counts(p.ft for p in pairs),
        paired=paired, by_depth=summarize_by_depth(pairs) if by_depth else None, **fields,
    )
