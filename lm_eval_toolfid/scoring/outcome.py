"""One view of one case: generation → :class:`Outcome` (every call scored against the tool it names).

The first stage of the scoring core: parse (:mod:`lm_eval_toolfid.formats`) → validate each call
(:mod:`lm_eval_toolfid.core.schema`) → what the case amounts to. Never raises.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Sequence

from lm_eval_toolfid.core.records import CallOutcome, Case, Outcome, OutcomeKind, ToolCall, bounded, bounded_text
from lm_eval_toolfid.core.schema import validate_arguments
from lm_eval_toolfid.formats import parse_calls
from lm_eval_toolfid.formats.call_end import truncate_call
from lm_eval_toolfid.scoring.gold import match_gold_calls
from lm_eval_toolfid.scoring.grounding import result_grounding

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


_SCORED: dict[tuple[Any, ...], tuple[Case, Outcome]] = {}
"""Outcomes already scored in this process (case, text, options): a run scores the base's answer to a case once
for every adapter view it pairs with, and an adapter that answers as the base did scores the same text again.
Cases and outcomes are frozen records; the case itself is kept with its outcome, so an id is never reused."""
_SCORED_CHARS = 0


def score_generation(text: Any, case: Case, task_allowed: Sequence[str] | None = None,
                     string_arguments_valid: bool = True) -> Outcome:
    """Score one generation for one case: every call, then what the case amounts to. Never raises:
    a failure inside scoring becomes a ``malformed`` outcome with keyword ``scoring_error``."""
    text = text if isinstance(text, str) else ("" if text is None else str(text))
    key = (id(case), text, tuple(task_allowed) if task_allowed is not None else None, string_arguments_valid)
    found = _SCORED.get(key)
    if found is not None and found[0] is case:
        return found[1]
    outcome = _score_once(text, case, task_allowed, string_arguments_valid)
    global _SCORED_CHARS
    if len(_SCORED) >= 65_536 or _SCORED_CHARS > 32_000_000:  # bounded: texts may be long (a run's answers)
        _SCORED.clear()
        _SCORED_CHARS = 0
    _SCORED[key] = (case, outcome)
    _SCORED_CHARS += len(text)
    return outcome


def _score_once(text: str, case: Case, task_allowed: Sequence[str] | None,
                string_arguments_valid: bool) -> Outcome:
    try:
        text = answer_text(text, case)
        return _score_generation(text, case, task_allowed, string_arguments_valid)
    except Exception as exc:  # noqa: BLE001 — one case must never end a run; counted and visible
        log.warning("tool_use_fidelity: scoring failed on case %s: %s: %s", case.id, type(exc).__name__, exc)
        return Outcome(kind=OutcomeKind.MALFORMED, keyword="scoring_error",
                       detail=f"{type(exc).__name__}: {exc}"[:300], attempted=True, text=bounded_text(text),
                       gold_tool=None if case.irrelevant else False,
                       gold_args=False if any(g.has_values for g in case.expected_calls) else None,
                       result_grounding=_nothing_grounded(case))


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
                       gold_args=False if has_gold_values else None, result_grounding=result_grounding([], case))
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
        gold_args=match_gold_calls(calls, expected) if has_gold_values else None,
        result_grounding=result_grounding(calls, case),
    )


def _nothing_grounded(case: Case) -> tuple[int, int] | None:
    """A failed scoring reproduces no result value (never raises: it is the fallback's fallback)."""
    try:
        found = result_grounding([], case)
    except Exception:  # noqa: BLE001
        return None
    return found

