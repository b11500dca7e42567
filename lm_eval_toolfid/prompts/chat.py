"""The ``chat`` prompt style: the model's own chat template, rendered by the task with per-case tools.

lm-eval's ``--apply_chat_template`` cannot pass tools per case, so the task renders the template
itself: ``tokenizer.apply_chat_template(messages, tools=[...], add_generation_prompt=True,
tokenize=False)``. Some templates ignore ``tools`` (SmolLM2's does): that is detected once, by
rendering a probe conversation with and without a probe tool, and then the tool specs go into a
system message instead (or, for a template that refuses a system role, in front of the user turn).
Where the tools went is recorded as ``chat_tools_in``. A case that offers no tool (an irrelevance
case; demonstrations bring their own tools) is rendered with no ``tools=`` and no tools block.

A case's history (earlier calls, tool results) follows the request as OpenAI-shaped messages; a
template that does not render assistant ``tool_calls`` or ``tool`` messages is detected once per
template by a probe render (:mod:`lm_eval_toolfid.prompts.history`; only when a case has a history),
and gets them as text instead; recorded as ``chat_history_in``.

Also read off the template once, with probe conversations, for the run's provenance: the call
format it asks for (:data:`NATIVE_FORMATS`), the token that ends an assistant turn (generation
must stop there), and the system prompt it inserts when the conversation has none (Qwen2.5's
"You are Qwen, created by Alibaba Cloud..."). :func:`shipped_chat_template` finds a chat template
an adapter folder ships (the prompts are rendered with the base's tokenizer either way).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from functools import cached_property
from pathlib import Path
from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import Case, ToolSpec
from lm_eval_toolfid.prompts.history import (
    CALLS_AS_TEXT,
    CALLS_IN_TEMPLATE,
    RESULTS_AS_USER,
    RESULTS_IN_TEMPLATE,
    chat_history,
    detect_history_in,
    history_in_label,
    merge_user_turns,
)

log = logging.getLogger("lm_eval.toolfid")

TOOLS_IN_TEMPLATE = "template"
TOOLS_IN_SYSTEM = "system"
TOOLS_IN_USER = "user"

CHAT_TOOLS_INSTRUCTION = (
    "Answer the user's request with a tool call: a JSON object "
    '{"name": <tool name>, "arguments": {<parameter>: <value>}} whose arguments follow the tool\'s '
    "parameter schema (a JSON list of such objects for several calls). Use only these tools."
)

NATIVE_FORMATS = (("<function=", "qwen_xml"), ("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"),
                  ("<|python_tag|>", "llama"))
"""Marker a template mentions -> the surface format its calls take (first match wins)."""

_PROBE_ANSWER = "toolfid_probe_answer_7f3a"
_PROBE_SYSTEM = "toolfid_probe_system_7f3a"
_PROBE_TOOL = ToolSpec(name="toolfid_probe_tool_7f3a", description="probe",
                       parameters={"type": "object", "properties": {"x": {"type": "string"}}})


def template_spec(tool: ToolSpec) -> dict[str, Any]:
    """The wrapped OpenAI form chat templates expect in ``tools=``."""
    return {"type": "function", "function": tool.for_prompt()}


def template_sha(template: str | None) -> str | None:
    return hashlib.sha256(template.encode("utf-8")).hexdigest() if template else None


def native_call(name: str, arguments: dict[str, Any], template: str) -> str:
    """A call as the template's own format writes it, for chat demonstrations.

    Hermes/Qwen-style templates (they mention ``<tool_call>``) wrap the JSON in ``<tool_call>``
    tags; anything else gets the bare JSON object.
    """
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    if "<tool_call>" in template:
        return f"<tool_call>\n{body}\n</tool_call>"
    return body


def system_tools_text(tools: list[ToolSpec], system_prompt: str | None) -> str:
    """The system message that carries the tools for a template that ignores ``tools=``."""
    specs = "[\n" + ",\n".join(json.dumps(t.for_prompt(), ensure_ascii=False) for t in tools) + "\n]"
    head = f"{system_prompt}\n\n" if system_prompt else ""
    return f"{head}You can call these tools (JSON Schema parameter specs):\n{specs}\n\n{CHAT_TOOLS_INSTRUCTION}"


def chat_template_of(tokenizer: Any) -> str | None:
    """The tokenizer's chat template (the default one when it has several named templates)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default") or next(iter(template.values()), None)
    return template or None


def shipped_chat_template(folder: str | Path) -> tuple[Path, str] | None:
    """The chat template a model or adapter folder ships, and the file it is in (``chat_template.jinja``,
    ``chat_template.json`` or ``tokenizer_config.json``); None when it ships none."""
    root = Path(folder).expanduser()
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja, jinja.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
    for name in ("chat_template.json", "tokenizer_config.json"):
        path = root / name
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            continue
        if isinstance(value, list):  # [{"name": "default", "template": ...}, ...]
            named = {v.get("name"): v.get("template") for v in value if isinstance(v, dict)}
            value = named.get("default") or next(iter(named.values()), None)
        if isinstance(value, str) and value:
            return path, value
    return None


_TOKENIZERS: dict[tuple, Any] = {}
"""(source, load options, the folder's files as they are) -> the tokenizer loaded: every view of a run renders with the
same one, and loading it again costs 0.2 s (SmolLM2) to 1 s (Qwen2.5) a view."""


def _folder_state(source: str) -> tuple:
    """A local folder's top-level files (name, size, modification time): a tokenizer file changed is another key."""
    folder = Path(source).expanduser()
    if not folder.is_dir():
        return ()
    try:
        return tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in folder.iterdir() if f.is_file()))
    except OSError:
        return ()


def load_tokenizer(model_args: dict[str, Any]) -> Any:
    """The tokenizer named by the model args (``tokenizer``, else ``pretrained``): local folder or
    offline hub cache only, never the network. Loaded once per process (a copy each call: a caller may replace its
    chat template)."""
    source = model_args.get("tokenizer") or model_args.get("pretrained")
    if not source:
        raise ToolfidError("prompt_style chat needs the model's tokenizer: pass pretrained= (or tokenizer=) "
                           "in --model_args")
    kwargs: dict[str, Any] = {"local_files_only": True}
    if model_args.get("revision") and not model_args.get("tokenizer"):
        kwargs["revision"] = str(model_args["revision"])
    if str(model_args.get("trust_remote_code", "")).lower() == "true":
        kwargs["trust_remote_code"] = True
    key = (str(source), tuple(sorted(kwargs.items())), _folder_state(str(source)))
    if key not in _TOKENIZERS:
        if len(_TOKENIZERS) > 8:
            _TOKENIZERS.clear()
        _TOKENIZERS[key] = _load_tokenizer(str(source), kwargs)
    return copy.copy(_TOKENIZERS[key])


def _load_tokenizer(source: str, kwargs: dict[str, Any]) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(source), **kwargs)
    except Exception as exc:  # noqa: BLE001 - any load failure is one user-facing line
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ToolfidError(f"prompt_style chat: cannot load the tokenizer {source} from a local folder or the "
                           f"offline hub cache ({first}); download it first or use prompt_style plain") from None


class ChatPrompter:
    """Renders cases through one tokenizer's chat template."""

    def __init__(self, tokenizer: Any, source: str = "", warn: bool = True) -> None:
        template = chat_template_of(tokenizer)
        if not template:
            raise ToolfidError(f"prompt_style chat: the tokenizer {source or ''} has no chat template; use "
                               "prompt_style plain or raw, or pass a chat model's tokenizer= in --model_args")
        self.tokenizer = tokenizer
        self.template: str = template
        self.source = source
        self.sha = template_sha(template)
        self.tools_in = self._detect_tools_in()
        self.history_text_cases: set[str] = set()
        """Cases whose history the template could not render natively (rendered as text instead)."""
        self.native_format = next((fmt for marker, fmt in NATIVE_FORMATS if marker in template), None)
        """The surface format the template asks calls in (None: not one we recognise)."""
        self.end_of_turn = self._detect_end_of_turn()
        """The token the template writes after an assistant message (e.g. ``<|im_end|>``), or None."""
        self.default_system_prompt = self._detect_default_system_prompt()
        """What the template writes as the system message when the conversation has none, or None."""
        if warn and self.tools_in != TOOLS_IN_TEMPLATE:
            log.warning("tool_use_fidelity: the chat template of %s ignores tools=; the tool specs go in a %s "
                        "message instead (chat_tools_in=%s)", source or "this tokenizer",
                        self.tools_in, self.tools_in)

    @classmethod
    def from_model_args(cls, model_args: dict[str, Any], template_file: str | None = None,
                        warn: bool = True) -> ChatPrompter:
        """The model's tokenizer; ``template_file`` (a Jinja file) replaces its chat template."""
        return cls.from_tokenizer(load_tokenizer(model_args), str(model_args.get("tokenizer") or
                                                                  model_args.get("pretrained")), template_file, warn)

    @classmethod
    def from_tokenizer(cls, tok: Any, source: str, template_file: str | None = None,
                       warn: bool = True) -> ChatPrompter:
        if template_file:
            path = Path(template_file).expanduser()
            try:
                tok.chat_template = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ToolfidError(f"chat_template {path}: cannot read the Jinja file ({exc})") from None
            source = f"{source} with chat_template {path}"
        return cls(tok, source, warn)

    def _apply(self, messages: list[dict[str, Any]], tools: list[ToolSpec] | None,
               add_generation_prompt: bool = True) -> str:
        kwargs: dict[str, Any] = {"add_generation_prompt": add_generation_prompt, "tokenize": False}
        if tools:
            kwargs["tools"] = [template_spec(t) for t in tools]
        text = self.tokenizer.apply_chat_template(messages, **kwargs)
        if not isinstance(text, str):  # some tokenizers return a list for a batch of one
            text = text[0] if isinstance(text, list) and text and isinstance(text[0], str) else str(text)
        return text

    def _detect_tools_in(self) -> str:
        probe = [{"role": "user", "content": "probe request"}]
        try:
            with_tools = self._apply(probe, [_PROBE_TOOL])
        except Exception:  # noqa: BLE001 - a template that chokes on tools= ignores them for our purposes
            with_tools = None
        plain = self._render_or_fail(probe, None)
        if with_tools is not None and with_tools != plain and _PROBE_TOOL.name in with_tools:
            return TOOLS_IN_TEMPLATE
        try:
            self._apply([{"role": "system", "content": "probe system"}, *probe], None)
        except Exception:  # noqa: BLE001 - e.g. "System role not supported"
            return TOOLS_IN_USER
        return TOOLS_IN_SYSTEM

    @cached_property
    def history_in(self) -> tuple[str, str]:
        """Whether this template renders a history's assistant ``tool_calls`` and ``tool`` messages
        itself (probed once, on first use: a case set with histories)."""
        found = detect_history_in(self._apply, _PROBE_TOOL, self.tools_in == TOOLS_IN_TEMPLATE, self._native_call)
        if found != (CALLS_IN_TEMPLATE, RESULTS_IN_TEMPLATE):
            log.warning("tool_use_fidelity: the chat template of %s does not render a conversation's tool calls "
                        "or tool results; they go in as text instead (chat_history_in=%s)",
                        self.source or "this tokenizer", history_in_label(*found))
        return found

    @property
    def history_label(self) -> str:
        return history_in_label(*self.history_in)

    def _native_call(self, name: str, arguments: dict[str, Any]) -> str:
        return native_call(name, arguments, self.template)

    def _detect_end_of_turn(self) -> str | None:
        """The first special token the template writes after an assistant message."""
        probe = [{"role": "user", "content": "probe request"}, {"role": "assistant", "content": _PROBE_ANSWER}]
        try:
            text = self._apply(probe, None, add_generation_prompt=False)
        except Exception:  # noqa: BLE001 - a template that cannot render a finished turn: unknown
            return None
        at = text.rfind(_PROBE_ANSWER)
        if at < 0:
            return None
        rest = text[at + len(_PROBE_ANSWER):].lstrip()
        decoder = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
        tokens = sorted({str(getattr(t, "content", t)) for t in decoder.values()}, key=len, reverse=True)
        return next((t for t in tokens if t and rest.startswith(t)), None)

    def _detect_default_system_prompt(self) -> str | None:
        """Render the probe with and without a sentinel system message: what stands where the sentinel
        stood, when the conversation has no system message, is the template's default system prompt."""
        if self.tools_in == TOOLS_IN_USER:
            return None
        probe = [{"role": "user", "content": "probe request"}]
        tools = [_PROBE_TOOL] if self.tools_in == TOOLS_IN_TEMPLATE else None
        try:
            without = self._apply(probe, tools)
            with_system = self._apply([{"role": "system", "content": _PROBE_SYSTEM}, *probe], tools)
        except Exception:  # noqa: BLE001
            return None
        at = with_system.find(_PROBE_SYSTEM)
        if at < 0:
            return None
        prefix, suffix = with_system[:at], with_system[at + len(_PROBE_SYSTEM):]
        if len(without) > len(prefix) + len(suffix) and without.startswith(prefix) and without.endswith(suffix):
            return without[len(prefix):len(without) - len(suffix)].strip() or None
        return None

    def system_prompt_inserted(self, system_prompt: str | None) -> str | None:
        """The system text the template adds to every prompt of a run (none when the run gives one)."""
        if system_prompt or self.tools_in != TOOLS_IN_TEMPLATE:
            return None  # the conversation has a system message: the template's default is not used
        return self.default_system_prompt

    def is_eos(self, token: str) -> bool:
        """Whether ``token`` is the tokenizer's end-of-sequence token (lm-eval's backends stop there)."""
        return token == getattr(self.tokenizer, "eos_token", None)

    def _render_or_fail(self, messages: list[dict[str, str]], tools: list[ToolSpec] | None) -> str:
        try:
            return self._apply(messages, tools)
        except Exception as exc:  # noqa: BLE001
            msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise ToolfidError(f"prompt_style chat: the chat template of {self.source or 'the tokenizer'} "
                               f"failed to render: {msg}") from None

    def messages(self, case: Case, demos: list[tuple[list[ToolSpec], str, dict[str, Any]]],
                 system_prompt: str | None,
                 history_in: tuple[str, str] | None = None) -> tuple[list[dict[str, Any]], list[ToolSpec]]:
        """The conversation and the tools shown for one case (demo tools follow the case's, the case's
        history its request; ``history_in`` overrides how the history goes in)."""
        tools = list(case.tools)
        for demo_tools, _, _ in demos:
            tools += [t for t in demo_tools if t.name not in {x.name for x in tools}]
        turns: list[dict[str, Any]] = []
        for _, request, call in demos:
            turns.append({"role": "user", "content": request})
            turns.append({"role": "assistant",
                          "content": native_call(call["name"], call["arguments"], self.template)})
        turns.append({"role": "user", "content": case.prompt})
        if case.history:
            calls_in, results_in = history_in or self.history_in
            turns += chat_history(case.history, calls_in, results_in, self._native_call)
            if results_in == RESULTS_AS_USER:
                turns = merge_user_turns(turns)
        if self.tools_in == TOOLS_IN_TEMPLATE:
            head = [{"role": "system", "content": system_prompt}] if system_prompt else []
            return head + turns, tools
        if not tools and not system_prompt:  # no tool at all (an irrelevance case): no tools block
            return turns, []
        block = system_tools_text(tools, system_prompt) if tools else str(system_prompt)
        if self.tools_in == TOOLS_IN_SYSTEM:
            return [{"role": "system", "content": block}, *turns], []
        first = dict(turns[0])
        first["content"] = f"{block}\n\n{first['content']}"
        return [first, *turns[1:]], []

    def render(self, case: Case, demos: list[tuple[list[ToolSpec], str, dict[str, Any]]],
               system_prompt: str | None = None) -> str:
        messages, tools = self.messages(case, demos, system_prompt)
        if case.history and self.history_in != (CALLS_AS_TEXT, RESULTS_AS_USER):
            try:
                return self._apply(messages, tools or None)
            except Exception as exc:  # noqa: BLE001 - e.g. a template that takes one call per turn
                if not self.history_text_cases:
                    log.warning("tool_use_fidelity: the chat template of %s cannot render the history of case %s "
                                "(%s); its calls and results go in as text (so for any other such case: "
                                "chat_history_text_cases)", self.source or "this tokenizer", case.id,
                                str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__)
                self.history_text_cases.add(case.id)
                messages, tools = self.messages(case, demos, system_prompt, (CALLS_AS_TEXT, RESULTS_AS_USER))
        return self._render_or_fail(messages, tools or None)
