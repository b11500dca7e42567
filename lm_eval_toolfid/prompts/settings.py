"""What changes the prompt text (:class:`PromptSettings`, part of a run's identity) and the
names of the prompt styles and plain templates."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

TEMPLATE_VERSION = "plain-v1"
"""The default template of :class:`PromptSettings` (kept for references and the fixture model)."""

PRIMER = '{"name": "'
"""Start of the answer written into ``plain-v3`` prompts; the model continues after it."""

INSTRUCTION = (
    "Answer each request with exactly one tool call: a JSON object "
    '{"name": <tool name>, "arguments": {<parameter>: <value>}} '
    "whose arguments follow the tool's parameter schema. Use only the tools listed for that request."
)

NO_TOOLS = "(none: no tool is available for this request)"
"""What the plain templates show under ``### Tools`` for a case that offers no tool."""

STOP_SEQUENCES = ["\n###"]

PROMPT_STYLES = ("plain", "chat", "raw")
"""The styles a prompt is rendered in; ``auto`` (:mod:`lm_eval_toolfid.prompts.auto`) resolves to one."""
STYLE_CHOICES = ("auto", *PROMPT_STYLES)
"""What a run may ask for."""
CHAT_DEMOS = 0
"""Demonstrations of the chat style when the run gives no ``demos`` (the model's template, as its users
prompt it); the plain and raw styles default to the task's ``plain_demos``."""


@dataclass(frozen=True)
class PromptSettings:
    """Everything that changes the prompt text. Part of a run's identity for pairing."""

    demos: int = 2
    instruction: str = INSTRUCTION
    template: str = TEMPLATE_VERSION
    style: str = "plain"
    system_prompt: str | None = None
    """Chat style only: a system message in front of the conversation."""
    chat_template_sha: str | None = None
    """Chat style only: sha256 of the tokenizer's chat template (a changed template never pairs)."""
    history: str | None = None
    """Case sets with conversation histories only: the history rendering's version (and, chat style, how
    the template takes the history), so a change in how histories render never pairs."""

    def fingerprint(self) -> str:
        data = asdict(self)
        for key, default in (("style", "plain"), ("system_prompt", None), ("chat_template_sha", None),
                             ("history", None)):
            if data[key] == default:  # plain runs keep the fingerprint they had before styles existed
                del data[key]
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

TEMPLATE_SIGNATURES = "plain-v2"
TEMPLATE_EXAMPLES = "plain-v3"
TEMPLATES = (TEMPLATE_VERSION, TEMPLATE_SIGNATURES, TEMPLATE_EXAMPLES)

