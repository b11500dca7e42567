"""Two views of one case → its :class:`PairScore` (argument disagreement, identical output)."""

from __future__ import annotations

from typing import Any, Iterable

from lm_eval_toolfid.core.records import CallOutcome, Case, Outcome, PairScore

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
    depth = 1 if isinstance(case, str) else case.turn_depth
    return PairScore(case_id=case_id, ft=ft, base=base, relevant=relevant, arg_disagreement=disagreement,
                     identical_output=identical, tool=tool, turn_depth=depth)

