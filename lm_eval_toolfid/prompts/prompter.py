"""Prompts: one entry point for the three styles (:class:`Prompter`, :func:`render_prompt`).

- ``plain``: :mod:`lm_eval_toolfid.prompts.plain` (instruction, demonstrations, tools, request);
- ``chat``: the model's own chat template with the case's tools (:mod:`lm_eval_toolfid.prompts.chat`);
- ``raw``: the bare request text only, as the original design did (a conversation: its turns as
  role-labelled text).

A case's history renders in each style as :mod:`lm_eval_toolfid.prompts.history` says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import Case
from lm_eval_toolfid.prompts.history import HISTORY_FORMAT, raw_transcript
from lm_eval_toolfid.prompts.plain import ExampleIndex, pick_demos, primer_for, primer_of, render_plain
from lm_eval_toolfid.prompts.settings import (
    PROMPT_STYLES,
    TEMPLATE_EXAMPLES,
    TEMPLATE_VERSION,
    TEMPLATES,
    PromptSettings,
)

if TYPE_CHECKING:
    from lm_eval_toolfid.prompts.chat import ChatPrompter


def render_prompt(case: Case, settings: PromptSettings = PromptSettings(),
                  chat: ChatPrompter | None = None, examples: ExampleIndex | None = None) -> str:
    """The full prompt for a case in the settings' style (``chat`` needs the model's :class:`ChatPrompter`)."""
    if settings.style == "raw":
        return raw_transcript(case)
    if settings.style == "chat":
        if chat is None:
            raise ToolfidError("prompt_style chat needs the model's chat template (a ChatPrompter)")
        return chat.render(case, pick_demos(case, settings.demos), settings.system_prompt)
    if settings.style != "plain":
        raise ToolfidError(f"unknown prompt_style {settings.style!r}; use one of {', '.join(PROMPT_STYLES)}")
    return render_plain(case, settings, examples)


class Prompter:
    """What the task renders with: the prompt settings (chat template hash included) and, for the
    chat style, the loaded chat template. Built once per run from the task settings."""

    def __init__(self, style: str = "plain", demos: int = 2, system_prompt: str | None = None,
                 model_args: dict[str, Any] | None = None, chat_template: str | None = None,
                 template: str = TEMPLATE_VERSION, cases: list[Case] | None = None) -> None:
        if style not in PROMPT_STYLES:
            raise ToolfidError(f"unknown prompt_style {style!r}; use one of {', '.join(PROMPT_STYLES)}")
        if template not in TEMPLATES:
            raise ToolfidError(f"unknown prompt_template {template!r}; use one of {', '.join(TEMPLATES)}")
        self.chat: ChatPrompter | None = None
        if style == "chat":
            from lm_eval_toolfid.prompts.chat import ChatPrompter

            self.chat = ChatPrompter.from_model_args(model_args or {}, chat_template)
        self.has_history = any(c.history for c in cases or [])
        history = None
        if self.has_history:
            history = HISTORY_FORMAT + (f"; chat: {self.chat.history_label}" if self.chat is not None else "")
        self.settings = PromptSettings(demos=demos, style=style, template=template if style == "plain" else TEMPLATE_VERSION,
                                       system_prompt=system_prompt if style == "chat" else None,
                                       chat_template_sha=self.chat.sha if self.chat else None, history=history)
        self.examples = ExampleIndex(cases or []) if self.settings.template == TEMPLATE_EXAMPLES else None
        self.primer = primer_of(self.settings)

    def render(self, case: Case) -> str:
        return render_prompt(case, self.settings, self.chat, self.examples)

    def primed(self, case: Case) -> bool:
        """The case's prompt starts the answer with a call (plain-v3): a no-call answer cannot be seen."""
        return bool(primer_for(case, self.settings))

    def answer(self, text: str, case: Case) -> str:
        """A generation as the whole answer (the primer the case's prompt ended with put back in front)."""
        return primer_for(case, self.settings) + text

    def provenance(self) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt_style": self.settings.style}
        if self.settings.style == "plain":
            out["prompt_template"] = self.settings.template
        if self.chat is not None:
            out.update(chat_tools_in=self.chat.tools_in, chat_template_sha=self.chat.sha,
                       chat_template_source=self.chat.source)
            if self.has_history:
                out["chat_history_in"] = self.chat.history_label
                if self.chat.history_text_cases:
                    out["chat_history_text_cases"] = sorted(self.chat.history_text_cases)
        return out
