"""Prompts: one entry point for the three styles (:class:`Prompter`, :func:`render_prompt`).

- ``plain``: :mod:`lm_eval_toolfid.prompts.plain` (instruction, demonstrations, tools, request);
- ``chat``: the model's own chat template with the case's tools (:mod:`lm_eval_toolfid.prompts.chat`);
- ``raw``: the bare request text only, as the original design did (a conversation: its turns as
  role-labelled text);
- ``auto`` resolves to ``chat`` or ``plain`` for the model (:mod:`lm_eval_toolfid.prompts.auto`); what is
  rendered, fingerprinted and recorded is the resolved style.

A case's history renders in each style as :mod:`lm_eval_toolfid.prompts.history` says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import Case
from lm_eval_toolfid.prompts.auto import choose_style
from lm_eval_toolfid.prompts.chat import TOOLS_IN_TEMPLATE, ChatPrompter, _folder_state, template_spec
from lm_eval_toolfid.prompts.history import HISTORY_FORMAT, raw_transcript
from lm_eval_toolfid.prompts.plain import (ExampleIndex, PlainTurns, pick_demos, plain_turns, primer_for, primer_of,
                                           render_plain)
from lm_eval_toolfid.prompts.settings import (
    CHAT_DEMOS,
    PROMPT_STYLES,
    STOP_SEQUENCES,
    STYLE_CHOICES,
    TEMPLATE_EXAMPLES,
    TEMPLATE_VERSION,
    TEMPLATES,
    PromptSettings,
)


_PROMPTERS: dict[tuple[Any, ...], Prompter] = {}
"""What :func:`shared_prompter` built: every view of a run (a hundred adapters) renders the same cases alike."""


def shared_prompter(style: str, demos: int | None, system_prompt: str | None, model_args: dict[str, Any],
                    chat_template: str | None, template: str, cases: list[Case], plain_demos: int) -> Prompter:
    """A :class:`Prompter` built once per process for the same arguments (the same case objects, the same tokenizer
    folder and chat template file, unchanged on disk), its prompts rendered once. What a prompt depends on of the
    model args is the tokenizer (``tokenizer``, else ``pretrained``, its revision and ``trust_remote_code``), never the
    adapter: both views render with the base's tokenizer."""
    source = model_args.get("tokenizer") or model_args.get("pretrained")
    tokenizer = (str(source), str(model_args.get("revision") or ""), str(model_args.get("trust_remote_code", "")).lower(),
                 _folder_state(str(source))) if source and style not in ("plain", "raw") else None
    key = (style, demos, system_prompt, tokenizer, _file_state(chat_template), template, tuple(map(id, cases)),
           plain_demos)
    prompter = _PROMPTERS.get(key)
    if prompter is None:
        prompter = Prompter(style, demos, system_prompt, model_args, chat_template, template=template, cases=cases,
                            plain_demos=plain_demos)
        if len(_PROMPTERS) > 8:
            _PROMPTERS.clear()
        _PROMPTERS[key] = prompter
    return prompter


def _file_state(path: str | None) -> tuple[Any, ...] | None:
    if not path:
        return None
    try:
        st = Path(path).expanduser().stat()
    except OSError:
        return (str(path),)
    return (str(path), st.st_size, st.st_mtime_ns)


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
    """What the task renders with: the resolved style (``auto`` chooses), the prompt settings (chat
    template hash included) and, for the chat style, the loaded chat template. Built once per run
    from the task settings. ``demos=None``: the style's default (chat :data:`CHAT_DEMOS`, else
    ``plain_demos``)."""

    def __init__(self, style: str = "plain", demos: int | None = 2, system_prompt: str | None = None,
                 model_args: dict[str, Any] | None = None, chat_template: str | None = None,
                 template: str = TEMPLATE_VERSION, cases: list[Case] | None = None, plain_demos: int = 2) -> None:
        if style not in STYLE_CHOICES:
            raise ToolfidError(f"unknown prompt_style {style!r}; use one of {', '.join(STYLE_CHOICES)}")
        if template not in TEMPLATES:
            raise ToolfidError(f"unknown prompt_template {template!r}; use one of {', '.join(TEMPLATES)}")
        self.choice, self.chat = choose_style(style, model_args or {}, chat_template)
        style = self.choice.style
        if demos is None:
            demos = CHAT_DEMOS if style == "chat" else plain_demos
        self.has_history = any(c.history for c in cases or [])
        history = None
        if self.has_history:
            history = HISTORY_FORMAT + (f"; chat: {self.chat.history_label}" if self.chat is not None else "")
        self.settings = PromptSettings(demos=demos, style=style, template=template if style == "plain" else TEMPLATE_VERSION,
                                       system_prompt=system_prompt if style == "chat" else None,
                                       chat_template_sha=self.chat.sha if self.chat else None, history=history)
        self.examples = ExampleIndex(cases or []) if self.settings.template == TEMPLATE_EXAMPLES else None
        self.primer = primer_of(self.settings)
        self._cases = list(cases or [])
        """Held: the ids of :attr:`_rendered` are these cases' (never an id a collected case left behind)."""
        self._own = {id(c) for c in self._cases}
        self._rendered: dict[int, str] = {}

    def render(self, case: Case) -> str:
        """The case's prompt (rendered once per case of the prompter's own case list)."""
        if id(case) not in self._own:
            return render_prompt(case, self.settings, self.chat, self.examples)
        text = self._rendered.get(id(case))
        if text is None:
            text = self._rendered[id(case)] = render_prompt(case, self.settings, self.chat, self.examples)
        return text

    def plain_turns(self, case: Case) -> PlainTurns:
        """The plain style's prompt in its parts (for a chat template's turns); the plain style only."""
        if self.settings.style != "plain":
            raise ToolfidError(f"prompt_style {self.settings.style} has no plain turns")
        return plain_turns(case, self.settings, self.examples)

    def chat_request(self, case: Case) -> dict[str, Any]:
        """The chat style's request for a server that renders the template itself: the messages (as rendered
        here) and every tool the prompt shows, in the OpenAI ``tools=`` form (sent whether or not the template
        renders them, as a deployed client does)."""
        if self.chat is None:
            raise ToolfidError("a chat request needs prompt_style chat (the model's chat template)")
        demos = pick_demos(case, self.settings.demos)
        messages, _ = self.chat.messages(case, demos, self.settings.system_prompt)
        tools = list(case.tools)
        for demo_tools, _, _ in demos:
            tools += [t for t in demo_tools if t.name not in {x.name for x in tools}]
        return {"messages": messages, "tools": [template_spec(t) for t in tools]}

    def primed(self, case: Case) -> bool:
        """The case's prompt starts the answer with a call (plain-v3): a no-call answer cannot be seen."""
        return bool(primer_for(case, self.settings))

    def answer_prefix(self, case: Case) -> str:
        """What the case's prompt wrote of the answer (plain-v3's primer; '' in every other style): the scorer
        reads it in front of the generation, and so does the rule that stops generation early."""
        return primer_for(case, self.settings)

    def answer(self, text: str, case: Case) -> str:
        """A generation as the whole answer (the primer the case's prompt ended with put back in front)."""
        return self.answer_prefix(case) + text

    @property
    def expected_format(self) -> str | None:
        """The surface format this prompt asks calls in: the template's own where it shows the tools,
        bare JSON where the task wrote the instruction (plain style, tools in a system/user message)."""
        if self.settings.style == "raw":
            return None
        if self.chat is not None and self.chat.tools_in == TOOLS_IN_TEMPLATE:
            return self.chat.native_format
        return "bare_json"

    def until(self, until: list[str]) -> list[str]:
        """A task's stop sequences for this style. The chat style drops the plain prompt's block
        separator (``\\n###`` means nothing in a chat turn) and stops at the template's end-of-turn
        token where that is not the tokenizer's end-of-sequence token (which lm-eval adds itself)."""
        if self.chat is None:
            return list(until)
        out = [u for u in until if u not in STOP_SEQUENCES]
        eot = self.chat.end_of_turn
        if eot and not self.chat.is_eos(eot) and eot not in out:
            out.append(eot)
        return out

    def provenance(self) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt_style": self.settings.style, "prompt_style_requested": self.choice.requested,
                               "prompt_style_reason": self.choice.reason, "demos": self.settings.demos,
                               "expected_format": self.expected_format}
        if self.settings.style == "plain":
            out["prompt_template"] = self.settings.template
        if self.chat is not None:
            out.update(chat_tools_in=self.chat.tools_in, chat_template_sha=self.chat.sha,
                       chat_template_source=self.chat.source, chat_end_of_turn=self.chat.end_of_turn,
                       chat_system_prompt_inserted=self.chat.system_prompt_inserted(self.settings.system_prompt))
            if self.has_history:
                out["chat_history_in"] = self.chat.history_label
                if self.chat.history_text_cases:
                    out["chat_history_text_cases"] = sorted(self.chat.history_text_cases)
        return out
