"""The plain prompt style: an instruction, demonstrations, then the case's tools and request.

Works for base (non-chat) models: each block lists the tools offered, the request, and a
``### Call`` line the model completes with one JSON call. Demonstrations (``demos.json``) use
tools that the case does not offer, so they teach the format without leaking the answer. Three
templates (``prompt_template``):

- ``plain-v1``: tools as JSON Schema lines (the original; the fixture model was trained on it);
- ``plain-v2``: tools as compact signatures (``f(a: string, b?: "x" | "y")``): nothing to copy;
- ``plain-v3`` (the ``tool_use_fidelity`` task's plain default): signatures, each followed by an
  ``Example:`` call of *that* tool taken from another case of the case file that offers the
  same tool (same name and schema), and the answer started for the model with ``{"name": "``
  (:data:`PRIMER`; restored in front of the generation before scoring, see :func:`restore_primer`;
  a case that offers no tool is not primed).
  Every offered tool gets its example, so the examples show argument formats without telling
  which tool the request needs. Small models copy the parameter *schema* into ``arguments``
  under v1; an example call right under the signature is what they copy instead.

A case with a history gets its conversation as a transcript between its ``### Request`` and the open
``### Call`` (earlier calls under ``### Call``, results in ``### Result`` blocks, later user turns as
``### Request``; :mod:`lm_eval_toolfid.prompts.history`).
"""

from __future__ import annotations

from dataclasses import dataclass

import hashlib
import json
from importlib import resources
from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import Case, ToolSpec
from lm_eval_toolfid.prompts.history import plain_transcript
from lm_eval_toolfid.prompts.settings import (
    NO_TOOLS,
    PRIMER,
    TEMPLATE_EXAMPLES,
    TEMPLATE_SIGNATURES,
    TEMPLATE_VERSION,
    TEMPLATES,
    PromptSettings,
)


def _load_demos() -> list[tuple[list[ToolSpec], str, dict[str, Any]]]:
    data = json.loads(resources.files("lm_eval_toolfid.prompts").joinpath("demos.json").read_text(encoding="utf-8"))
    return [([ToolSpec.model_validate(t) for t in d["tools"]], d["request"], d["call"]) for d in data]


# Demonstration pool: (tools offered, request, call). Tool names are chosen not to collide
# with the bundled case set; a demo whose tools collide with a case's tools is skipped.
DEMO_POOL: list[tuple[list[ToolSpec], str, dict[str, Any]]] = _load_demos()


def _type_of(schema: Any) -> str:
    """A JSON Schema as a short type expression: ``"a" | "b"``, ``[string]``, ``{lat: number}``."""
    if not isinstance(schema, dict):
        return "any"
    if isinstance(schema.get("enum"), list):
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"][:12])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = " | ".join(str(k) for k in kind)
    if kind == "array":
        return f"[{_type_of(schema.get('items'))}]"
    if kind == "object" or "properties" in schema:
        props = schema.get("properties")
        if isinstance(props, dict) and props:
            return "{" + _params(schema) + "}"
        return "object"
    text = str(kind or "any")
    bounds = [f"{op} {schema[key]}" for key, op in (("minimum", ">="), ("maximum", "<="),
                                                   ("exclusiveMinimum", ">"), ("exclusiveMaximum", "<"))
              if isinstance(schema.get(key), (int, float))]
    return text + (" " + " ".join(bounds) if bounds else "")


def _params(schema: dict[str, Any]) -> str:
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = set(schema.get("required") or []) if isinstance(schema.get("required"), list) else set()
    parts = []
    for name, sub in props.items():
        desc = sub.get("description") if isinstance(sub, dict) else None
        note = f" /* {desc} */" if isinstance(desc, str) and desc and len(desc) <= 60 else ""
        parts.append(f"{name}{'' if name in required else '?'}: {_type_of(sub)}{note}")
    return ", ".join(parts)


def _signature(tool: ToolSpec) -> str:
    params = tool.parameters if isinstance(tool.parameters, dict) else {}
    desc = f"  # {tool.description}" if tool.description else ""
    return f"{tool.name}({_params(params)}){desc}"


def _render_tools(tools: list[ToolSpec], template: str = TEMPLATE_VERSION,
                  examples: dict[str, dict[str, Any]] | None = None) -> str:
    if not tools:  # an irrelevance case that offers nothing: said in words, not an empty block
        return NO_TOOLS
    if template in (TEMPLATE_SIGNATURES, TEMPLATE_EXAMPLES):
        lines = []
        for t in tools:
            lines.append(_signature(t))
            if examples and t.name in examples:
                lines.append("Example: " + json.dumps(examples[t.name], ensure_ascii=False))
        return "\n".join(lines)
    return "\n".join(json.dumps(t.for_prompt(), ensure_ascii=False) for t in tools)


def render_block(tools: list[ToolSpec], request: str, call: dict[str, Any] | None = None,
                 template: str = TEMPLATE_VERSION, examples: dict[str, dict[str, Any]] | None = None,
                 history: str = "") -> str:
    """One example block; without ``call`` it ends at ``### Call`` for the model to complete.
    ``history``: the transcript of a conversation between the request and that ``### Call``
    (:func:`lm_eval_toolfid.prompts.history.plain_transcript`)."""
    head = f"### Tools\n{_render_tools(tools, template, examples)}\n### Request\n{request}\n{history}### Call\n"
    if call is None:
        return head
    return head + json.dumps(call, ensure_ascii=False) + "\n"


def _spec_key(tool: ToolSpec) -> str:
    return tool.name + "\0" + json.dumps(tool.parameters, sort_keys=True, ensure_ascii=False, default=str)


class ExampleIndex:
    """Example calls per tool, from the gold calls of a case file (``plain-v3``).

    A tool's example for case X is the exact gold call of another case whose offered tool has the
    same name *and* schema, chosen stably from X's id; never X's own call. A tool no other case
    calls with exact arguments gets no example (a case file with one case per tool gets none).
    """

    def __init__(self, cases: list[Case]) -> None:
        self._by_spec: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for case in cases:
            specs = {t.name: _spec_key(t) for t in case.tools}
            for gold in case.expected_calls:
                if gold.arguments is not None and gold.name in specs:
                    self._by_spec.setdefault(specs[gold.name], []).append(
                        (case.id, {"name": gold.name, "arguments": gold.arguments}))

    def for_case(self, case: Case) -> dict[str, dict[str, Any]]:
        out = {}
        for tool in case.tools:
            options = [call for cid, call in self._by_spec.get(_spec_key(tool), []) if cid != case.id]
            if options:
                pick = int(hashlib.sha256(f"{case.id}\0{tool.name}".encode()).hexdigest(), 16) % len(options)
                out[tool.name] = options[pick]
        return out


def pick_demos(case: Case, n: int) -> list[tuple[list[ToolSpec], str, dict[str, Any]]]:
    """``n`` demos whose tools the case does not offer; rotation chosen stably from the case id."""
    if n <= 0:
        return []
    names = set(case.tool_names)
    usable = [d for d in DEMO_POOL if not names & {t.name for t in d[0]}]
    if not usable:
        return []
    start = int(hashlib.sha256(case.id.encode()).hexdigest(), 16) % len(usable)
    rotated = usable[start:] + usable[:start]
    return rotated[: min(n, len(rotated))]


@dataclass(frozen=True)
class PlainTurns:
    """The plain prompt's parts, for a chat template's turns (lm-eval's ``--apply_chat_template``): the
    instruction, each demonstration as (its block up to ``### Call``, its call), the case's open block, the primer."""

    instruction: str
    demos: list[tuple[str, str]]
    request: str
    primer: str

    def text(self) -> str:
        """The plain prompt as one text (:func:`render_plain`)."""
        parts = [self.instruction + "\n\n"] if self.instruction else []
        parts += [head + call + "\n\n" for head, call in self.demos]
        return "".join(parts) + self.request + self.primer


def plain_turns(case: Case, settings: PromptSettings = PromptSettings(),
                examples: ExampleIndex | None = None) -> PlainTurns:
    """The plain prompt of a case in its parts (instruction, demos, then the open block; ``plain-v3``: with
    examples, primed)."""
    if settings.template not in TEMPLATES:
        raise ToolfidError(f"unknown prompt_template {settings.template!r}; use one of {', '.join(TEMPLATES)}")
    v3 = settings.template == TEMPLATE_EXAMPLES
    demo_template = TEMPLATE_SIGNATURES if v3 else settings.template
    demos = [(render_block(tools, req, None, demo_template), json.dumps(call, ensure_ascii=False))
             for tools, req, call in pick_demos(case, settings.demos)]
    request = render_block(case.tools, case.prompt, template=settings.template,
                           examples=examples.for_case(case) if v3 and examples is not None else None,
                           history=plain_transcript(case))
    return PlainTurns(settings.instruction or "", demos, request, primer_for(case, settings))


def render_plain(case: Case, settings: PromptSettings = PromptSettings(), examples: ExampleIndex | None = None) -> str:
    """The plain prompt: instruction, demos, then the open block (``plain-v3``: with examples, primed)."""
    return plain_turns(case, settings, examples).text()


def primer_of(settings: PromptSettings) -> str:
    """The start of the answer the prompt writes for the model ('' when the model writes it all)."""
    return PRIMER if settings.style == "plain" and settings.template == TEMPLATE_EXAMPLES else ""


def primer_for(case: Case, settings: PromptSettings) -> str:
    """:func:`primer_of` for one case: a case that offers no tool is not primed (there is no call to start)."""
    return primer_of(settings) if case.tools else ""


def restore_primer(prompt: Any, text: str) -> str:
    """The whole answer: the primer the prompt ended with, then the generation. Used wherever a
    generation is read back (the task, lm-eval samples files), so a primed answer scores whole."""
    if isinstance(prompt, str) and prompt.endswith(PRIMER):
        return PRIMER + text
    return text


def render_demo_call(name: str, arguments: dict[str, Any]) -> str:
    """A call exactly as the demonstrations write it (used by fixture training data)."""
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


