"""A case's conversation history (earlier calls, recorded tool results, later user turns) in each style.

- ``plain``: a transcript in the plain blocks — each earlier call as the template's call line under
  ``### Call``, each recorded result as a ``### Result`` block, a later user turn as ``### Request``,
  assistant text as ``### Reply`` — then the ``### Call`` the model completes (:func:`plain_transcript`).
- ``raw``: the request and the conversation as role-labelled plain text, ending with ``Assistant:``
  (:func:`raw_transcript`).
- ``chat``: OpenAI-shaped messages for the model's own template (assistant ``tool_calls`` as
  ``{"type": "function", "function": {"name", "arguments": dict}}``, ``tool`` messages with ``name`` and
  ``tool_call_id``). Templates that cannot render them are found with a probe render
  (:func:`detect_history_in`); then the calls go into the assistant's text in the template's own call
  format, and the results into user turns (``Tool result (name): ...``), consecutive user turns merged
  (:func:`chat_history`).

A single-turn case has no history: every style renders it exactly as it did before histories existed.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from lm_eval_toolfid.core.records import Case, HistoryCall, Message, ToolSpec

HISTORY_FORMAT = "history-v1"
"""Version of the history rendering; part of the prompt fingerprint of case sets that have histories
(bump it whenever a history renders differently)."""

CALLS_IN_TEMPLATE = "template"
CALLS_AS_TEXT = "text"
RESULTS_IN_TEMPLATE = "template"
RESULTS_AS_USER = "user"

_PROBE_ARG = "toolfid_probe_arg_51d2"
_PROBE_RESULT = "toolfid_probe_result_8e4b"


def call_json(call: HistoryCall) -> str:
    """An earlier call as the plain prompts write calls (one JSON object)."""
    return json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)


# --- plain ------------------------------------------------------------------------------------

def plain_transcript(case: Case) -> str:
    """The blocks that follow the case's ``### Request`` and precede its open ``### Call`` ('' when the
    case has no history)."""
    parts: list[str] = []
    for msg in case.history:
        if msg.role == "user":
            parts.append(f"### Request\n{msg.content}\n")
        elif msg.role == "tool":
            parts.append(f"### Result\n{msg.content}\n")
        else:
            if msg.content:
                parts.append(f"### Reply\n{msg.content}\n")
            if msg.tool_calls:
                parts.append("### Call\n" + "".join(call_json(c) + "\n" for c in msg.tool_calls))
    return "".join(parts)


# --- raw --------------------------------------------------------------------------------------

def raw_transcript(case: Case) -> str:
    """The raw style: the bare request for a single-turn case; otherwise the conversation as
    role-labelled text ending where the assistant speaks next."""
    if not case.history:
        return case.prompt
    return conversation_text(case) + "\n\nAssistant:"


def conversation_text(case: Case) -> str:
    """The request and the history as role-labelled text (what reports show of a multi-turn case)."""
    parts = [f"User: {case.prompt}"]
    for msg in case.history:
        if msg.role == "user":
            parts.append(f"User: {msg.content}")
        elif msg.role == "tool":
            parts.append(f"Tool result ({msg.name}): {msg.content}")
        else:
            text = "\n".join([*([msg.content] if msg.content else []),
                              *(call_json(c) for c in msg.tool_calls or [])])
            parts.append(f"Assistant: {text}")
    return "\n\n".join(parts)


# --- chat -------------------------------------------------------------------------------------

def template_call(call: HistoryCall) -> dict[str, Any]:
    """An earlier call in the shape HF chat templates read (``arguments`` a dict)."""
    out: dict[str, Any] = {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    if call.id is not None:
        out["id"] = call.id
    return out


def result_as_user(msg: Message) -> str:
    return f"Tool result ({msg.name}): {msg.content}"


def chat_history(history: list[Message], calls_in: str, results_in: str,
                 native_call: Callable[[str, dict[str, Any]], str]) -> list[dict[str, Any]]:
    """The history as chat messages. ``calls_in``/``results_in`` say whether the template renders
    assistant ``tool_calls`` / ``tool`` messages itself; otherwise the calls become the assistant's
    text (written by ``native_call``, the template's own call format) and the results user turns."""
    out: list[dict[str, Any]] = []
    for msg in history:
        if msg.role == "user":
            out.append({"role": "user", "content": msg.content})
        elif msg.role == "tool":
            if results_in == RESULTS_IN_TEMPLATE:
                out.append({"role": "tool", "content": msg.content, "name": msg.name,
                            "tool_call_id": msg.tool_call_id})
            else:
                out.append({"role": "user", "content": result_as_user(msg)})
        elif msg.tool_calls and calls_in == CALLS_IN_TEMPLATE:
            out.append({"role": "assistant", "content": msg.content or "",
                        "tool_calls": [template_call(c) for c in msg.tool_calls]})
        else:
            text = [*([msg.content] if msg.content else []),
                    *(native_call(c.name, c.arguments) for c in msg.tool_calls or [])]
            out.append({"role": "assistant", "content": "\n".join(text)})
    return out


def merge_user_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive user turns as one (templates that insist on alternating roles accept it)."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        if out and msg["role"] == "user" and out[-1]["role"] == "user" and set(msg) == set(out[-1]) == {"role", "content"}:
            out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n\n{msg['content']}"}
        else:
            out.append(msg)
    return out


def history_in_label(calls_in: str, results_in: str) -> str:
    """``chat_history_in`` as recorded in a run's provenance."""
    if calls_in == CALLS_IN_TEMPLATE and results_in == RESULTS_IN_TEMPLATE:
        return "template"
    parts = []
    if calls_in != CALLS_IN_TEMPLATE:
        parts.append("calls as assistant text")
    if results_in != RESULTS_IN_TEMPLATE:
        parts.append("results as user turns")
    return ", ".join(parts)


def detect_history_in(render: Callable[[list[dict[str, Any]], list[ToolSpec] | None], str],
                      probe_tool: ToolSpec, tools: bool,
                      native_call: Callable[[str, dict[str, Any]], str]) -> tuple[str, str]:
    """(calls_in, results_in) for one template, from probe renders: a conversation with one call of
    ``probe_tool`` and its result; the template renders a part when the probe's argument value (the
    call) or result text appears in its output. Each part is probed with the other in its fallback
    form, so a template that chokes on one does not hide the other."""
    probe_call = HistoryCall(id="call_probe", name=probe_tool.name, arguments={"x": _PROBE_ARG})
    history = [Message(role="assistant", tool_calls=[probe_call]),
               Message(role="tool", content=_PROBE_RESULT, tool_call_id="call_probe", name=probe_tool.name)]
    head = [{"role": "user", "content": "probe request"}]
    shown = [probe_tool] if tools else None

    def shows(calls_in: str, results_in: str, marker: str) -> bool:
        messages = head + chat_history(history, calls_in, results_in, native_call)
        if results_in == RESULTS_AS_USER:
            messages = merge_user_turns(messages)
        try:
            text = render(messages, shown)
        except Exception:  # noqa: BLE001 - a template that raises cannot render this part
            return False
        return marker in text

    calls_in = CALLS_IN_TEMPLATE if shows(CALLS_IN_TEMPLATE, RESULTS_AS_USER, _PROBE_ARG) else CALLS_AS_TEXT
    results_in = RESULTS_IN_TEMPLATE if shows(CALLS_AS_TEXT, RESULTS_IN_TEMPLATE, _PROBE_RESULT) else RESULTS_AS_USER
    if (calls_in, results_in) != (CALLS_AS_TEXT, RESULTS_AS_USER) and not (
            shows(calls_in, results_in, _PROBE_ARG) and shows(calls_in, results_in, _PROBE_RESULT)):
        return CALLS_AS_TEXT, RESULTS_AS_USER  # each part renders alone but not together
    return calls_in, results_in
