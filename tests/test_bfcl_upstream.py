"""BFCL v4 upstream ``live_irrelevance`` (884 entries, 8 of them conversations with earlier assistant
messages), read in place from the installed ``bfcl-eval`` distribution (scripts/setup.sh installs it with
--no-deps; the package is never imported, it needs dependencies we do not install)."""

from __future__ import annotations

import io
import json
import sys
from collections import Counter
from importlib import metadata
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.core.records import Case
from lm_eval_toolfid.prompts.history import conversation_text
from lm_eval_toolfid.prompts.prompter import Prompter

from .chat_templates import ALTERNATING, HERMES_TOOLS, IGNORES_TOOLS

VERSION = "2026.3.23"
SETUP = f"run `bash scripts/setup.sh` (or: .venv/bin/python -m pip install --no-deps bfcl-eval=={VERSION})"
CONVERSATIONS = {  # id -> turn depth (1 + the assistant messages of its question)
    "live_irrelevance_125-11-0": 2, "live_irrelevance_132-11-7": 2, "live_irrelevance_292-72-1": 4,
    "live_irrelevance_296-73-3": 2, "live_irrelevance_298-73-5": 2, "live_irrelevance_547-169-0": 2,
    "live_irrelevance_549-169-2": 3, "live_irrelevance_553-169-6": 2,
}


def upstream(name: str) -> Path:
    """A data file of the installed bfcl-eval wheel; a missing one fails the test in one line."""
    try:
        dist = metadata.distribution("bfcl-eval")
    except metadata.PackageNotFoundError:
        pytest.fail(f"bfcl-eval is not installed: {SETUP}", pytrace=False)
    if dist.version != VERSION:
        pytest.fail(f"bfcl-eval {dist.version} is installed, the tests need {VERSION}: {SETUP}", pytrace=False)
    path = Path(str(dist.locate_file(f"bfcl_eval/data/{name}")))
    if not path.is_file():
        pytest.fail(f"{path} not found in the installed bfcl-eval: {SETUP}", pytrace=False)
    return path


def _toolfid(argv: list[str], stdin: str = "") -> tuple[int, str, str]:
    """``toolfid ARGV`` in this process, ``stdin`` as its standard input: exit code, stdout, stderr."""
    from lm_eval_toolfid.cli import main

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, redirect_stdout(out), redirect_stderr(err):
        mp.setattr(sys, "stdin", io.StringIO(stdin))
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def entries() -> dict[str, dict]:
    lines = upstream("BFCL_v4_live_irrelevance.json").read_text(encoding="utf-8").splitlines()
    return {e["id"]: e for e in (json.loads(line) for line in lines if line.strip())}


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> tuple[list[Case], str, Path]:
    """The upstream file through the command line tool's own code, in this process (a new interpreter's imports
    added seconds and checked nothing more: tests/test_lm_eval_cli.py::test_installed_entry_points runs the
    installed console script)."""
    target = tmp_path_factory.mktemp("bfcl_upstream") / "live_irrelevance.jsonl"
    code, stdout, stderr = _toolfid(["import-bfcl", str(upstream("BFCL_v4_live_irrelevance.json")), "-o",
                                     str(target)])
    assert code == 0, stderr
    return load_cases(target), stdout, target


def test_every_upstream_live_irrelevance_entry_becomes_a_case(entries, imported):
    cases, stdout, target = imported
    assert len(entries) == 884
    assert stdout == f"wrote 884 cases (live_irrelevance 884) to {target}\n"  # nothing skipped
    assert [c.id for c in cases] == list(entries)
    assert all(c.irrelevant and c.category == "live_irrelevance" and c.expected_calls == [] for c in cases)
    assert sum(not c.tools for c in cases) == 4
    assert {c.id: c.turn_depth for c in cases if c.history} == CONVERSATIONS
    assert Counter(c.turn_depth for c in cases) == {1: 876, 2: 6, 3: 1, 4: 1}
    for case in cases:
        messages = entries[case.id]["question"][0]
        said = [m["content"].strip() for m in messages if m["role"] == "assistant"]
        assert [m.content for m in case.history if m.role == "assistant"] == said, case.id
        assert all(m.role in ("assistant", "user") and not m.tool_calls for m in case.history), case.id
        assert not case.history or case.history[-1].role == "user"


def test_live_irrelevance_125_11_0_keeps_its_assistant_answer(entries, imported):
    cases, _, _ = imported
    case = next(c for c in cases if c.id == "live_irrelevance_125-11-0")
    system, user, assistant, later = entries[case.id]["question"][0]
    assert [m["role"] for m in (system, user, assistant, later)] == ["system", "user", "assistant", "user"]
    assert case.prompt == f"{system['content'].strip()}\n\n{user['content'].strip()}"
    assert [(m.role, m.content, m.tool_calls) for m in case.history] == [
        ("assistant", assistant["content"].strip(), None), ("user", later["content"].strip(), None)]
    assert later["content"] == "回答不正确，直接发起oncall" and len(case.tools) == 3
    assert conversation_text(case) == (f"User: {case.prompt}\n\nAssistant: {assistant['content'].strip()}\n\n"
                                       f"User: {later['content']}")


def test_the_conversations_render_in_every_style(imported, tmp_path):
    """Each earlier assistant message where it was said: plain's ``### Reply``, chat's assistant turn (a
    real Jinja template), raw's ``Assistant:`` line; the last user message right before the model's turn."""
    from .test_prompt_styles import chat_base

    cases, _, _ = imported
    conversations = [c for c in cases if c.history]
    plain = Prompter("plain", demos=1, template="plain-v3", cases=cases)
    raw = Prompter("raw", cases=cases)
    chats = [Prompter("chat", demos=0, model_args={"pretrained": str(chat_base(tmp_path / name, template))},
                      cases=cases) for name, template in (("hermes", HERMES_TOOLS), ("ignores", IGNORES_TOOLS),
                                                          ("alternating", ALTERNATING))]
    for case in conversations:
        last = case.history[-1].content
        text = plain.render(case)
        blocks = "".join(f"### {'Reply' if m.role == 'assistant' else 'Request'}\n{m.content}\n" for m in case.history)
        primer = plain.answer("", case)  # plain-v3 starts a call where tools are offered
        assert text.endswith(f"### Request\n{case.prompt}\n{blocks}### Call\n{primer}"), case.id
        assert raw.render(case) == conversation_text(case) + "\n\nAssistant:"
        said = [m.content for m in case.history if m.role == "assistant"]
        hermes = chats[0].render(case)
        turns = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>" for m in case.history)  # the template's
        assert hermes.endswith(f"{case.prompt}<|im_end|>{turns}<|im_start|>assistant\n"), case.id  # {%- trims
        for chat in chats[1:]:
            text = chat.render(case)
            at = [text.index(s) for s in said]
            assert at == sorted(at) and text.index(case.prompt) < at[0] and text.rindex(last) > at[-1], case.id
    assert all(c.render(cases[0]) for c in chats)  # the single-turn cases of the set render too


def test_check_scores_answers_to_the_conversations(imported):
    """``toolfid check --cases`` on the imported file: an answer to a conversation is scored like any other."""
    _, _, target = imported
    answers = [{"case_id": "live_irrelevance_125-11-0", "text": "好的，我来发起 oncall。"},
               {"case_id": "live_irrelevance_549-169-2", "text": json.dumps({"name": "get_weather", "arguments": {}})}]
    code, stdout, stderr = _toolfid(["check", "--cases", str(target), "--jsonl"],
                                    stdin="".join(json.dumps(a, ensure_ascii=False) + "\n" for a in answers))
    lines = [json.loads(line) for line in stdout.splitlines()]
    assert code == 1, stderr  # not every answer is a valid call (prose is right here)
    assert [(r["case_id"], r["kind"]) for r in lines[:2]] == [("live_irrelevance_125-11-0", "no_call"),
                                                           ("live_irrelevance_549-169-2", "schema_error")]
    assert lines[2]["summary"]["false_call_rate"] == 0.5
