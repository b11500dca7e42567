"""The ``auto`` prompt style: which style a model gets, and why (:func:`choose_style`).

``auto`` measures the tool calling a model's users deploy: the model's own chat template with the
case's tools when the tokenizer has a template that renders ``tools=`` (detected as the chat style
does, with a probe tool), else the plain style (no chat template, or one that ignores ``tools=``,
like SmolLM2's; or no tokenizer to look at). An explicit style is taken as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.prompts.chat import TOOLS_IN_TEMPLATE, ChatPrompter, chat_template_of, load_tokenizer

AUTO = "auto"


@dataclass(frozen=True)
class StyleChoice:
    """The style a run asked for, the one it renders with, and why."""

    requested: str
    style: str
    reason: str

    def note(self) -> str:
        """The one line a run logs about it."""
        return f"prompt_style {self.requested} -> {self.style}: {self.reason}"


def choose_style(requested: str, model_args: dict[str, Any], chat_template_file: str | None = None
                 ) -> tuple[StyleChoice, ChatPrompter | None]:
    """The style to render with and, for the chat style, the model's :class:`ChatPrompter`."""
    if requested != AUTO:
        chat = ChatPrompter.from_model_args(model_args, chat_template_file) if requested == "chat" else None
        return StyleChoice(requested, requested, "given"), chat
    source = model_args.get("tokenizer") or model_args.get("pretrained")
    if not source:
        return StyleChoice(AUTO, "plain", "no tokenizer to inspect (no pretrained= or tokenizer= in the model "
                                          "args)"), None
    try:
        tok = load_tokenizer(model_args)
    except ToolfidError as exc:
        return StyleChoice(AUTO, "plain", f"the tokenizer could not be inspected ({exc})"), None
    if not chat_template_file and chat_template_of(tok) is None:
        return StyleChoice(AUTO, "plain", f"the tokenizer of {source} has no chat template"), None
    chat = ChatPrompter.from_tokenizer(tok, str(source), chat_template_file, warn=False)
    if chat.tools_in != TOOLS_IN_TEMPLATE:
        return StyleChoice(AUTO, "plain", f"the chat template of {chat.source} ignores tools= (it renders "
                                          "nothing of the tools offered)"), None
    asks = f", calls asked for as {chat.native_format}" if chat.native_format else ""
    return StyleChoice(AUTO, "chat", f"the chat template of {chat.source} renders tools={asks}"), chat
