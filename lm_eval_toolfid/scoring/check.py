"""Scoring one generation without a model, for ``toolfid check``: the outcome from the one scoring
core, plus what the parser found per call (format, name), where a schema error is, and the gold
results (``gold_tool``, ``gold_args``: :attr:`Outcome.gold_tool` / :attr:`Outcome.gold_args`)."""

from __future__ import annotations

from typing import Any

from lm_eval_toolfid.core.records import Case, Outcome
from lm_eval_toolfid.formats import parse_calls
from lm_eval_toolfid.scoring.outcome import score_generation

UNCHECKED_SCHEMA = {"type": "object"}


class Checked:
    """One scored generation and how it is shown."""

    def __init__(self, case: Case, text: str, outcome: Outcome, schema_checked: bool = True) -> None:
        self.case, self.text, self.outcome, self.schema_checked = case, text, outcome, schema_checked

    @property
    def as_expected(self) -> bool:
        """The answer is what the case expects: on an irrelevance case, no call attempted (the scoring core's
        false-call rule, so a malformed attempt is a call); else a call that scores VALID."""
        if self.case.irrelevant:
            return not self.outcome.attempted
        return self.outcome.valid

    def as_dict(self) -> dict[str, Any]:
        o = self.outcome
        parsed = parse_calls(self.text)
        calls = [{"format": _surface(c), "name": c.name if isinstance(c.name, str) else None}
                 for c in parsed.calls]
        out: dict[str, Any] = {
            "case_id": self.case.id,
            "kind": o.kind.value,
            "keyword": o.keyword,
            "path": error_path(o),
            "detail": o.detail,
            "message": _message(o),
            "format": _value(o.surface),
            "name": o.name,
            "arguments": o.arguments,
            "hallucinated": o.hallucinated,
            "gold_tool": o.gold_tool,
            "gold_args": o.gold_args,
            "n_calls": o.n_calls,
            "calls": calls,
            "as_expected": self.as_expected,
        }
        if not self.schema_checked:
            out["schema_checked"] = False
        return out


def _value(x: Any) -> Any:
    return getattr(x, "value", x)


def _surface(call: Any) -> Any:
    return _value(getattr(call, "surface", None) or getattr(call, "format", None))


def error_path(outcome: Outcome) -> str | None:
    """Where a schema error is (``unit``, ``filters/max_price``), from the scoring core's detail."""
    if outcome.kind.value != "schema_error" or not outcome.detail or " at " not in outcome.detail:
        return None
    tail = outcome.detail.rsplit(" at ", 1)[1]
    return tail if tail and " " not in tail else None


def _message(outcome: Outcome) -> str | None:
    """The detail without its `` at PATH`` suffix (the path has its own field)."""
    path = error_path(outcome)
    return outcome.detail[: -len(f" at {path}")] if path and outcome.detail else outcome.detail


def _parse_only_case(text: str, case_id: str) -> Case:
    """No tools given: offer whatever the text calls, with an unconstrained schema (shape is checked,
    arguments are not; no hallucination judgement)."""
    names = [c.name for c in parse_calls(text).calls if isinstance(c.name, str) and c.name]
    names = list(dict.fromkeys(names)) or ["unknown_tool"]
    return Case(id=case_id, prompt="(toolfid check)", tools=[{"name": n, "parameters": UNCHECKED_SCHEMA}
                                                             for n in names], gold_tool_name=names[0])


def check_text(text: str, case: Case | None, case_id: str = "input") -> Checked:
    """Score ``text`` against ``case``; with no case, the shape only: nothing is expected, so the outcome
    carries no hallucination or gold judgement (and adds nothing to those metrics)."""
    if case is None:
        c = _parse_only_case(text, case_id)
        o = score_generation(text, c)
        o = o.model_copy(update={"hallucinated": None, "gold_tool": None, "gold_args": None,
                                 "calls": [k.model_copy(update={"hallucinated": None}) for k in o.calls]})
        return Checked(c, text, o, schema_checked=False)
    return Checked(case, text, score_generation(text, case))

