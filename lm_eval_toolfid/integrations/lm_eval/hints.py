"""What the task tells toolfid's model classes about each request it builds (:class:`RequestHints`, one
attribute of the lm-eval ``Instance``) and about its whole view (:class:`ViewHints`). Other LMs ignore them;
requests of other tasks carry none (:func:`hints_of` returns None, and the model classes do as before)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ATTRIBUTE = "toolfid_hints"


@dataclass(frozen=True)
class ViewHints:
    """Settings of the whole view (task metadata), the same on every request of it."""

    verify: bool | None = None
    """Metadata ``verify``: True forces verification of the base's answer, False turns it off, None lets the
    dtype decide (:func:`~lm_eval_toolfid.integrations.lm_eval.verify_policy.choose_verify`)."""
    prefix_cache: bool = True
    """Metadata ``prefix_cache``: prompts may start from a prefix shared with other rows, computed once."""


@dataclass(frozen=True)
class RequestHints:
    """One request of a tool_use_fidelity view."""

    answer_prefix: str = ""
    """What the scorer puts in front of the generation (plain-v3's primer): the stop rule reads it too."""
    chat: dict[str, Any] | None = None
    """The conversation and tools, for a served chat API (``api=chat``)."""
    check_stop: bool = False
    """Decode this row on past its early stop and compare (``check_stops``)."""
    draft: str | None = None
    """The stored base reference's answer to verify (primer removed), where the view verifies."""
    view: ViewHints = field(default_factory=ViewHints)


def attach(request: Any, hints: RequestHints) -> None:
    setattr(request, ATTRIBUTE, hints)


def hints_of(request: Any) -> RequestHints | None:
    """The hints the task attached to this request, or None (another task's request, or not built by the task)."""
    hints = getattr(request, ATTRIBUTE, None)
    return hints if isinstance(hints, RequestHints) else None
