"""Import Berkeley Function Calling Leaderboard (BFCL) single-turn files as a toolfid case file.

Question files are JSON lines ``{"id", "question": [[{"role", "content"}, ...]], "function": [spec...]}``;
answer files are JSON lines ``{"id", "ground_truth": [{"<function name>": {param: [acceptable...]}}, ...]}``.

Decisions (see docs/bfcl.md):

- ids are kept; ``category`` is taken from the file name (``BFCL_v4_simple_python.json`` -> ``simple_python``);
- the prompt is the text of the user turn(s); system turns are kept as a prefix of the prompt, separated
  by a blank line (a case has one prompt text; that is also what BFCL's prompting does for models
  without a system role);
- a question that is a conversation (earlier assistant messages, as 8 ``live_irrelevance`` questions are):
  the system and user messages before the first assistant message are the prompt, the rest is the case's
  ``history`` (assistant turns with text ``content``, user turns; consecutive user messages as one turn);
- tools are BFCL's ``function`` list with parameter schemas normalised to JSON Schema (``dict`` ->
  ``object``, ``float`` -> ``number``, ``tuple`` -> ``array``, ``any`` -> unconstrained) so chat
  templates and models see standard specs;
- ground truth becomes ``gold_calls`` with BFCL's acceptable-value lists kept as ``options``
  (``""`` = may be omitted, nested option maps inside dicts/lists preserved);
- ``irrelevance`` categories (no call expected) become ``irrelevant: true`` cases and need no answers; a
  question that offers no function at all (``"function": []``, as in ``live_irrelevance``) becomes an
  irrelevance case with no tools;
- an entry that is well-formed but cannot be a case (a conversation a case cannot hold, several turns,
  a call expected with no function offered, a tool schema that is not JSON Schema) is skipped and counted
  by reason (:class:`Conversion`); a malformed file (bad JSON, duplicate ids, answers that do not match)
  is an error;
- multi-turn and agentic categories are refused, each with its reason (:data:`REFUSALS`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lm_eval_toolfid.cases.load import parse_case_line
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.fsutil import atomic_write_text
from lm_eval_toolfid.core.schema import check_tool_schema, normalize_schema

SINGLE_TURN = ("simple", "simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
               "parallel_multiple", "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
               "irrelevance", "live_irrelevance")
IRRELEVANCE = ("irrelevance", "live_irrelevance")

MULTI_TURN_REFUSAL = (
    "multi-turn BFCL categories cannot be imported: their answers are checked by executing BFCL's stateful "
    "tool back-ends (file system, trading, travel, ...) and comparing the resulting states, and each turn's "
    "request depends on the execution results of the turns before it, which a static case cannot hold")

REFUSALS = {  # category prefix -> why it cannot be imported (other unknown categories: the generic line)
    "multi_turn": MULTI_TURN_REFUSAL,
    "memory": "the memory category cannot be imported: its answer is a final text the model reaches by "
              "executing BFCL's memory back-end (filled from earlier conversations); there is no expected call",
    "web_search": "the web_search category cannot be imported: its answer is a final text the model reaches by "
                  "executing live web searches; there is no expected call",
    "live_relevance": "the live_relevance category cannot be imported: any call to an offered function counts as "
                      "right (no expected call is given), which a case cannot express",
    "format_sensitivity": "format_sensitivity is not a questions file (it lists ids of other categories to "
                          "re-prompt in several formats); import those categories instead",
}

_FILE_NAME = re.compile(r"^(?:BFCL_v\d+_)?(?P<category>[A-Za-z0-9_]+?)(?:_result|_answer)?\.jsonl?$")


def category_of(path: str | Path) -> str:
    """``BFCL_v4_simple_python.json`` -> ``simple_python``."""
    match = _FILE_NAME.match(Path(path).name)
    if not match:
        raise ToolfidError(f"{path}: cannot tell the BFCL category from the file name "
                           "(expected BFCL_v<N>_<category>.json); pass --category")
    return match.group("category")


def _read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolfidError(f"cannot read {path}: {exc}") from None
    rows: list[tuple[int, dict[str, Any]]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ToolfidError(f"{path}:{lineno}: not valid JSON ({exc})") from None
        if not isinstance(row, dict) or not isinstance(row.get("id"), (str, int)):
            raise ToolfidError(f"{path}:{lineno}: expected a JSON object with an 'id'")
        rows.append((lineno, row))
    if not rows:
        raise ToolfidError(f"{path}: no entries in file")
    return rows


SKIP_MULTI_TURN = "several turns"
SKIP_CONVERSATION = "conversation a case cannot hold"
SKIP_NO_FUNCTION = "a call expected but no function offered"
SKIP_SCHEMA = "tool schema not JSON Schema"


class Skip(Exception):
    """An entry that is well-formed but cannot become a case: skipped and counted under ``reason``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass
class Conversion:
    """What one questions file became: the case dicts, and the entries skipped, counted by reason."""

    cases: list[dict[str, Any]] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    first_skip: dict[str, str] = field(default_factory=dict)
    """The first skipped entry of each reason, ``file:line: why`` (for ``--verbose``)."""

    def skip(self, reason: str, detail: str) -> None:
        self.skipped[reason] += 1
        self.first_skip.setdefault(reason, detail)


def conversation_of(question: Any, where: str) -> tuple[str, list[dict[str, Any]]]:
    """The case prompt and history from BFCL's ``question`` (one turn: a list of messages).

    The system and user messages before the first assistant message are the prompt (system text first, a
    blank line between messages); from the first assistant message on, the messages are the history:
    ``{"role": "assistant" | "user", "content"}``, consecutive user messages joined as one turn. Empty
    messages are left out. Raises :class:`Skip` for a question a case cannot hold (several turns; a
    conversation that opens with the assistant, ends with it, or has a system message after it),
    :class:`ToolfidError` for a malformed one."""
    if not isinstance(question, list) or not question:
        raise ToolfidError(f"{where}: 'question' must be a non-empty list of turns")
    if len(question) > 1:
        raise Skip(SKIP_MULTI_TURN, f"{where}: {len(question)} turns: a multi-turn question cannot be a case")
    turn = question[0]
    if isinstance(turn, dict):  # some files give the message list directly
        turn = [turn]
    if not isinstance(turn, list) or not all(isinstance(m, dict) for m in turn):
        raise ToolfidError(f"{where}: a turn must be a list of {{role, content}} messages")
    system: list[str] = []
    user: list[str] = []
    history: list[dict[str, Any]] = []
    for message in turn:
        role, content = message.get("role"), message.get("content")
        if not isinstance(content, str):
            raise ToolfidError(f"{where}: message content must be a string")
        if role not in ("system", "user", "assistant"):
            raise ToolfidError(f"{where}: message role {role!r} is not supported (system, user, assistant)")
        text = content.strip()
        if role == "assistant" and text and not any(user):
            raise Skip(SKIP_CONVERSATION, f"{where}: the conversation opens with an assistant message (a case "
                                          "starts with the user's request)")
        if (not history and role != "assistant") or not text:
            (system if role == "system" else user).append(text)
        elif role == "system":
            raise Skip(SKIP_CONVERSATION, f"{where}: a system message after an assistant message (a case's "
                                          "history holds user, assistant and tool turns)")
        elif role == "user" and history[-1]["role"] == "user":
            history[-1]["content"] += f"\n\n{text}"
        else:
            history.append({"role": role, "content": text})
    if not any(user):
        raise ToolfidError(f"{where}: the question has no user message")
    if history and history[-1]["role"] == "assistant":
        raise Skip(SKIP_CONVERSATION, f"{where}: the conversation ends with an assistant message (a case asks "
                                      "for the assistant's next step after a user turn)")
    return "\n\n".join(p for p in system + user if p), history


def tool_of(spec: Any, where: str) -> dict[str, Any]:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ToolfidError(f"{where}: every function needs a 'name'")
    out = {"name": spec["name"], "description": str(spec.get("description") or "")}
    params = spec.get("parameters", {"type": "object", "properties": {}})
    params = normalize_schema(params)
    if isinstance(params, dict) and "type" not in params and "properties" in params:
        params = {"type": "object", **params}
    out["parameters"] = params
    return out


def gold_calls_of(answer: dict[str, Any], where: str, names_only: bool) -> list[dict[str, Any]]:
    truth = answer.get("ground_truth")
    if not isinstance(truth, list) or not truth:
        raise ToolfidError(f"{where}: 'ground_truth' must be a non-empty list of calls")
    calls = []
    for call in truth:
        if not isinstance(call, dict) or len(call) != 1:
            raise ToolfidError(f"{where}: each ground_truth entry must be {{function name: {{param: [options]}}}}")
        (name, params), = call.items()
        if not isinstance(params, dict) or not all(isinstance(v, list) for v in params.values()):
            raise ToolfidError(f"{where}: ground truth of {name!r}: each parameter needs a list of acceptable values")
        calls.append({"name": name} if names_only else {"name": name, "options": params})
    return calls


def convert(questions_path: str | Path, answers_path: str | Path | None = None, *, names_only: bool = False,
            category: str | None = None) -> Conversion:
    """BFCL question (+ answer) files -> case dicts, each already validated as a loadable case, and the
    entries skipped (counted by reason)."""
    qpath = Path(questions_path).expanduser()
    category = category or category_of(qpath)
    refusal = next((why for prefix, why in REFUSALS.items() if category.startswith(prefix)), None)
    if refusal is not None:
        raise ToolfidError(f"{qpath}: {refusal}")
    if not category.startswith(SINGLE_TURN):
        raise ToolfidError(f"{qpath}: BFCL category {category!r} is not supported; single-turn categories: "
                           f"{', '.join(SINGLE_TURN)}")
    irrelevance = category in IRRELEVANCE or category.endswith("irrelevance")
    answers: dict[str, tuple[int, dict[str, Any]]] = {}
    apath = Path(answers_path).expanduser() if answers_path else None
    if apath is not None:
        for lineno, row in _read_jsonl(apath):
            aid = str(row["id"])
            if aid in answers:
                raise ToolfidError(f"{apath}:{lineno}: duplicate id {aid!r} (first on line {answers[aid][0]})")
            answers[aid] = (lineno, row)
    elif not irrelevance and not names_only:
        raise ToolfidError(f"{qpath}: category {category!r} needs its answers file (--answers "
                           f"possible_answer/{qpath.name}); or pass --names-only for single-function questions")

    out = Conversion()
    seen: dict[str, int] = {}
    for lineno, q in _read_jsonl(qpath):
        where = f"{qpath}:{lineno}"
        qid = str(q["id"])
        if qid in seen:
            raise ToolfidError(f"{where}: duplicate id {qid!r} (first on line {seen[qid]})")
        seen[qid] = lineno
        if not irrelevance and apath is not None and qid not in answers:
            raise ToolfidError(f"{where}: question {qid!r} has no entry in {apath}")
        try:
            case = _case_of(q, qid, where, category, irrelevance,
                            answers.get(qid), apath, names_only)
        except Skip as skip:
            out.skip(skip.reason, str(skip))
            continue
        out.cases.append(case)
    if apath is not None and not irrelevance:
        extra = [(ln, aid) for aid, (ln, _) in answers.items() if aid not in seen]
        if extra:
            ln, aid = extra[0]
            raise ToolfidError(f"{apath}:{ln}: answer {aid!r} has no question in {qpath}"
                               + (f" (+{len(extra) - 1} more)" if len(extra) > 1 else ""))
    return out


def _case_of(q: dict[str, Any], qid: str, where: str, category: str, irrelevance: bool,
             answer: tuple[int, dict[str, Any]] | None, apath: Path | None, names_only: bool) -> dict[str, Any]:
    """One question -> one case dict, validated as a loadable case (:class:`Skip` if it cannot be one)."""
    functions = q.get("function")
    if not isinstance(functions, list):
        raise ToolfidError(f"{where}: 'function' must be a list of function specs")
    if not functions and not irrelevance:
        raise Skip(SKIP_NO_FUNCTION, f"{where}: no function offered, but category {category!r} expects a call")
    prompt, history = conversation_of(q.get("question"), where)
    case: dict[str, Any] = {"id": qid, "prompt": prompt,
                            "tools": [tool_of(f, where) for f in functions], "category": category}
    if history:
        case["history"] = history
    if irrelevance:
        case["irrelevant"] = True
    elif answer is not None:
        case["gold_calls"] = gold_calls_of(answer[1], f"{apath}:{answer[0]}", names_only)
    elif len(functions) == 1:  # --names-only without answers: the one offered function
        case["gold_calls"] = [{"name": case["tools"][0]["name"]}]
    else:
        raise ToolfidError(f"{where}: {len(functions)} functions offered and no answers file: the expected "
                           "call cannot be known; pass --answers")
    line = json.dumps(case, ensure_ascii=False)
    for tool in case["tools"]:
        problem = check_tool_schema(tool["parameters"])
        if problem:
            raise Skip(SKIP_SCHEMA, f"{where}: tool {tool['name']!r}: parameters is not a valid JSON Schema: "
                                    f"{problem}")
    parse_case_line(line, where)  # one-line error if not loadable
    return case


def write_cases(cases: list[dict[str, Any]], output: str | Path) -> Path:
    text = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases)
    return atomic_write_text(Path(output).expanduser(), text)

def _reference_value(value: Any) -> Any:
    if isinstance(value, dict):  # a nested options map
        return reference_arguments(value)
    if isinstance(value, list):
        return [_reference_value(v) for v in value]
    return value


_OMIT = object()


def _first_option(options: list[Any]) -> Any:
    if not options or options[0] == "":
        return _OMIT
    return _reference_value(options[0])


def reference_arguments(options: dict[str, list[Any]]) -> dict[str, Any]:
    """One concrete call from a BFCL options map: the first acceptable value of each parameter
    (a first option ``""`` — "may be omitted" — leaves the parameter out), nested maps resolved."""
    out = {}
    for key, opts in options.items():
        value = _first_option(opts) if isinstance(opts, list) else _reference_value(opts)
        if value is not _OMIT:
            out[key] = value
    return out
