"""The scoring core: generation → :class:`Outcome`; two outcomes → :class:`PairScore`;
many pairs → :class:`Summary`. Every entry point (the lm-eval task, the CLI) calls these.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from .parsing import parse_calls
from .records import Case, Outcome, OutcomeKind, PairScore, Summary, ToolCall
from .schema import validate_arguments
from .stats import mcnemar_exact_p, mean_defined, mean_stderr


def declared_surface(case: Case, task_allowed: Sequence[str] | None = None) -> list[str] | None:
    """The tool surface a call must stay inside: the case's, else the task's, else None (gold rule)."""
    if case.allowed_tools is not None:
        return list(case.allowed_tools)
    return list(task_allowed) if task_allowed is not None else None


def is_hallucinated(name: str, case: Case, task_allowed: Sequence[str] | None = None) -> bool:
    """Name outside the declared surface, or ≠ gold when no surface is declared."""
    surface = declared_surface(case, task_allowed)
    return name not in surface if surface is not None else name != case.gold_tool_name


def score_call(call: ToolCall, case: Case, task_allowed: Sequence[str] | None = None) -> Outcome:
    """Check one call's shape, then its arguments against the schema of the tool it names
    (or, when it names no offered tool, against the gold tool's — so a renamed but otherwise
    correct call is valid *and* hallucinated)."""
    common: dict[str, Any] = {"surface": call.surface}
    if not isinstance(call.name, str) or not call.name:
        return Outcome(kind=OutcomeKind.WRONG_SHAPE, keyword="name", detail="missing or non-string 'name'", **common)
    common["name"] = call.name
    if isinstance(call.arguments, str):
        return Outcome(kind=OutcomeKind.WRONG_SHAPE, keyword="arguments_string",
                       detail="'arguments' is a string, not an object", **common)
    if not isinstance(call.arguments, dict):
        return Outcome(kind=OutcomeKind.WRONG_SHAPE, keyword="arguments",
                       detail="missing or non-object 'arguments'", **common)
    common["arguments"] = call.arguments
    tool = case.tool(call.name) or case.gold_tool
    violation = validate_arguments(call.arguments, tool.parameters)
    if violation is not None:
        where = f" at {violation.path}" if violation.path else ""
        return Outcome(kind=OutcomeKind.SCHEMA_ERROR, keyword=violation.keyword,
                       detail=f"{violation.message}{where}", **common)
    return Outcome(kind=OutcomeKind.VALID, hallucinated=is_hallucinated(call.name, case, task_allowed), **common)


def score_generation(text: str, case: Case, task_allowed: Sequence[str] | None = None) -> Outcome:
    """Score one generation for one case. The first call is the one judged; ``n_calls`` counts all."""
    parsed = parse_calls(text)
    if not parsed.calls:
        if not parsed.malformed:
            return Outcome(kind=OutcomeKind.NO_CALL)
        surface = parsed.malformed_formats[0] if parsed.malformed_formats else None
        return Outcome(kind=OutcomeKind.MALFORMED, surface=surface)
    outcome = score_call(parsed.calls[0], case, task_allowed)
    return outcome.model_copy(update={"n_calls": len(parsed.calls)})


def leaves(obj: Any, path: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], Any]]:
    """``(path, value)`` for every leaf of nested dicts; lists are leaves (order-sensitive)."""
    if isinstance(obj, dict) and obj:
        for key, value in obj.items():
            yield from leaves(value, path + (str(key),))
    else:
        yield path, obj


_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    """Equality that keeps JSON types apart (``1`` ≠ ``1.0`` ≠ ``True`` ≠ ``"1"``)."""
    return type(a) is type(b) and a == b


def field_disagreement(base_args: dict[str, Any], ft_args: dict[str, Any]) -> float:
    """Fraction of leaf paths (union of both calls) whose values differ or exist on one side only."""
    base_leaves, ft_leaves = dict(leaves(base_args)), dict(leaves(ft_args))
    paths = set(base_leaves) | set(ft_leaves)
    paths.discard(())  # both arguments empty: vacuous agreement
    if not paths:
        return 0.0
    differ = sum(not _same(base_leaves.get(p, _MISSING), ft_leaves.get(p, _MISSING)) for p in paths)
    return differ / len(paths)


def pair(case_id: str, ft: Outcome, base: Outcome | None) -> PairScore:
    """Combine the two views of one case."""
    disagreement = None
    if base is not None and ft.valid and base.valid:
        disagreement = field_disagreement(base.arguments or {}, ft.arguments or {})
    return PairScore(case_id=case_id, ft=ft, base=base, arg_disagreement=disagreement)


# --- per-case metric items: what one case contributes to each aggregate ---------------------

def hallucination_item(outcome: Outcome) -> int | None:
    """1/0 for a valid call (hallucinated or not); None when the call is not valid (not counted)."""
    return int(bool(outcome.hallucinated)) if outcome.valid else None


def summarize(pairs: Sequence[PairScore]) -> Summary:
    """Aggregate scored pairs into the run's metrics (the only place metrics are defined)."""
    n = len(pairs)
    ft_valid = [int(p.ft.valid) for p in pairs]
    counts: dict[str, int] = {}
    for p in pairs:
        key = p.ft.kind.value + (f":{p.ft.keyword}" if p.ft.keyword else "")
        counts[key] = counts.get(key, 0) + 1
    fields: dict[str, Any] = {
        "n": n,
        "json_valid_rate": mean_defined(ft_valid) or 0.0,
        "parse_rate": mean_defined([int(p.ft.kind.parsed) for p in pairs]) or 0.0,
        "hallucination_rate": hallucination_rate([hallucination_item(p.ft) for p in pairs]),
        "n_valid": sum(ft_valid),
        "outcome_counts": dict(sorted(counts.items())),
    }
    if n and all(p.base is not None for p in pairs):
        deltas = [p.validity_delta for p in pairs]
        disagreements = [p.arg_disagreement for p in pairs]
        fields.update(
            paired=True,
            base_json_valid_rate=mean_defined([int(p.base.valid) for p in pairs if p.base]) or 0.0,
            validity_delta=mean_defined(deltas) or 0.0,
            validity_delta_stderr=mean_stderr(deltas),
            validity_mcnemar_p=mcnemar_exact_p(deltas),
            arg_disagreement=arg_disagreement(disagreements),
            n_arg_pairs=sum(d is not None for d in disagreements),
        )
    return Summary(**fields)


def hallucination_rate(items: Sequence[int | None]) -> float:
    """Mean over valid calls; 0.0 when there is no valid call (nothing was named at all)."""
    value = mean_defined(items)
    return 0.0 if value is None else value


def arg_disagreement(items: Sequence[float | None]) -> float:
    """Mean leaf disagreement over cases where both views are valid; 0.0 when there are none."""
    value = mean_defined(items)
    return 0.0 if value is None else value
