"""BFCL import on the real BFCL files in ../shared/bfcl (nobody on this project wrote them)."""

from __future__ import annotations

import copy
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from lm_eval_toolfid import cli
from lm_eval_toolfid.cases.bfcl import category_of, convert, reference_arguments
from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import Case
from lm_eval_toolfid.core.schema import validate_arguments

from .conftest import SHARED

BFCL = SHARED / "bfcl"
pytestmark = pytest.mark.skipif(not BFCL.is_dir(), reason="../shared/bfcl not present")
QUESTION_FILES = sorted(p.name for p in BFCL.glob("BFCL_v*_*.json")) if BFCL.is_dir() else []
KNOWN = {k: v for k, v in json.loads((Path(__file__).parent / "data" / "bfcl_known_violations.json")
                                      .read_text()).items() if not k.startswith("_")}
WRONG = {"string": 12345, "integer": "12", "number": "1.5", "boolean": "yes", "array": "x", "object": "x"}


def _answers(name: str) -> Path | None:
    path = BFCL / "possible_answer" / name
    return path if path.is_file() else None


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _import(name: str, source: Path, target: Path, capsys) -> str:
    """One questions file through the real CLI; its one summary line."""
    argv = ["import-bfcl", str(source), "--output", str(target)]
    if _answers(name):
        argv += ["--answers", str(_answers(name))]
    capsys.readouterr()
    assert cli.main(argv) == 0, name
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out
    return out.strip()


@pytest.fixture(scope="module")
def imported_whole(tmp_path_factory) -> tuple[Path, dict[str, str], dict[str, list[Case]]]:
    """Every BFCL file through the real CLI once (its summary line kept), then back through cases.load_cases: the
    import of all the files is the expensive part, so every test below reads this one run (it ran twice before)."""
    out = tmp_path_factory.mktemp("bfcl")
    lines, loaded = {}, {}
    for name in QUESTION_FILES:
        target = out / f"{name}.jsonl"
        argv = ["import-bfcl", str(BFCL / name), "--output", str(target)]
        if _answers(name):
            argv += ["--answers", str(_answers(name))]
        printed = io.StringIO()
        with redirect_stdout(printed):
            assert cli.main(argv) == 0, name
        lines[name] = printed.getvalue()
        loaded[name] = load_cases(target)
    return out, lines, loaded


@pytest.fixture(scope="module")
def imported(imported_whole) -> dict[str, list[Case]]:
    return imported_whole[2]


def test_every_real_file_imports_whole(imported_whole):
    """Every entry of every real single-turn file becomes a case: none of them is skipped."""
    out, lines, loaded = imported_whole
    assert set(QUESTION_FILES) >= {f"BFCL_v4_{c}.json" for c in ("irrelevance", "live_simple", "multiple", "parallel",
                                                                 "parallel_multiple", "simple_python")}
    for name in QUESTION_FILES:
        assert lines[name].count("\n") == 1, lines[name]  # one summary line
        n = len(_lines(BFCL / name))
        assert lines[name].strip() == f"wrote {n} cases ({category_of(name)} {n}) to {out / f'{name}.jsonl'}", name
        assert len(loaded[name]) == n


def test_every_file_imports_and_loads(imported):
    assert len(imported) >= 6
    for name, cases in imported.items():
        questions = _lines(BFCL / name)
        assert [c.id for c in cases] == [str(q["id"]) for q in questions], name
        category = category_of(name)
        assert {c.category for c in cases} == {category}
        for case, q in zip(cases, questions):
            assert [t.name for t in case.tools] == [f["name"] for f in q["function"]]
            assert q["question"][0][-1]["content"].strip() in case.prompt
            types = json.dumps([t.parameters for t in case.tools])
            assert '"type": "dict"' not in types and '"type": "float"' not in types and '"type": "tuple"' not in types
        if "irrelevance" in category:
            assert all(c.irrelevant and c.expected_calls == [] for c in cases)
        else:
            answers = {str(a["id"]): a["ground_truth"] for a in _lines(_answers(name))}
            for case in cases:
                truth = answers[case.id]
                assert [g.name for g in case.expected_calls] == [next(iter(t)) for t in truth]
                assert [g.options for g in case.expected_calls] == [next(iter(t.values())) for t in truth]
    assert any(len(c.expected_calls) > 1 for c in imported["BFCL_v4_parallel.json"])


def test_system_turns_are_kept_as_a_prompt_prefix(imported):
    questions = {str(q["id"]): q for q in _lines(BFCL / "BFCL_v4_live_simple.json")}
    with_system = [c for c in imported["BFCL_v4_live_simple.json"]
                   if any(m["role"] == "system" for m in questions[c.id]["question"][0])]
    assert with_system
    for case in with_system:
        system, user = (next(m["content"] for m in questions[case.id]["question"][0] if m["role"] == r)
                        for r in ("system", "user"))
        assert case.prompt == f"{system.strip()}\n\n{user.strip()}"


def _reference_calls(imported):
    for name, cases in imported.items():
        for case in cases:
            for i, gold in enumerate(case.expected_calls):
                yield f"{case.id}#{i}", case.tool(gold.name).parameters, reference_arguments(gold.options)


def test_reference_answers_validate_except_the_reviewed_violations(imported):
    violating, total = {}, 0
    for key, schema, args in _reference_calls(imported):
        total += 1
        violation = validate_arguments(args, schema)
        if violation is not None:
            violating[key] = violation
    assert total >= 2000
    assert set(violating) == set(KNOWN), {k: v.message for k, v in violating.items() if k not in KNOWN}


def test_reference_arguments_resolve_options():
    options = {"a": [1, 2], "b": ["", 3], "c": [{"x": ["u"], "y": ["", "v"]}], "d": [[1, 2]], "e": [""]}
    assert reference_arguments(options) == {"a": 1, "c": {"x": "u"}, "d": [1, 2]}


def _mutations(schema: dict, args: dict):
    """(kind, mutated arguments, path that must be reported) for each mutation the schema allows."""
    props = schema.get("properties", {})
    for name in schema.get("required", []):
        if name in args:
            mutated = dict(args)
            del mutated[name]
            yield "drop_required", mutated, ""
            break
    for name, value in args.items():
        spec = props.get(name)
        if not isinstance(spec, dict):
            continue
        t = spec.get("type")
        if isinstance(t, str) and t in WRONG and "enum" not in spec:
            yield "wrong_type", {**args, name: WRONG[t]}, name
        if t == "integer":
            yield "bool_for_integer", {**args, name: True}, name
        if isinstance(spec.get("enum"), list) and all(isinstance(e, str) for e in spec["enum"]) and t == "string":
            yield "enum", {**args, name: "zz-not-an-option"}, name
        items = spec.get("items")
        if t == "array" and isinstance(items, dict) and items.get("type") in WRONG and isinstance(value, list) \
                and value and "enum" not in items:
            yield "array_item_type", {**args, name: [WRONG[items["type"]], *value[1:]]}, f"{name}/0"
        if t == "object" and isinstance(value, dict):
            for key in value:
                sub = (spec.get("properties") or {}).get(key, {})
                if isinstance(sub.get("type"), str) and sub["type"] in WRONG and "enum" not in sub:
                    yield "nested_field_type", {**args, name: {**value, key: WRONG[sub["type"]]}}, f"{name}/{key}"
                    break


def test_mutated_references_are_always_caught(imported):
    caught: dict[str, int] = {}
    for key, schema, args in _reference_calls(imported):
        if key in KNOWN:
            continue
        for kind, mutated, path in _mutations(schema, copy.deepcopy(args)):
            violation = validate_arguments(mutated, schema)
            assert violation is not None, (key, kind, mutated)
            assert violation.path == path, (key, kind, violation.path, violation.message)
            if kind == "drop_required":
                assert violation.keyword == "required", (key, violation.keyword)
            caught[kind] = caught.get(kind, 0) + 1
    # every mutation kind met real schemas with that feature, many times
    assert set(caught) == {"drop_required", "wrong_type", "bool_for_integer", "enum", "array_item_type",
                           "nested_field_type"}, caught
    assert min(caught.values()) >= 5, caught


def test_problems_are_one_line_with_file_and_line(tmp_path, capsys):
    q = BFCL / "BFCL_v4_multiple.json"
    with pytest.raises(ToolfidError, match="needs its answers file"):
        convert(q)
    with pytest.raises(ToolfidError, match=r"BFCL_v4_multiple\.json:1: 2 functions offered"):
        convert(q, names_only=True)
    names = convert(BFCL / "BFCL_v4_simple_python.json", names_only=True).cases
    assert all(c["gold_calls"] == [{"name": c["tools"][0]["name"]}] for c in names)
    with_answers = convert(q, _answers("BFCL_v4_multiple.json"), names_only=True).cases
    assert all("options" not in g for c in with_answers for g in c["gold_calls"])

    bad = tmp_path / "BFCL_v4_simple.json"
    lines = (BFCL / "BFCL_v4_simple_python.json").read_text().splitlines()[:3]
    bad.write_text("\n".join([lines[0], "{not json", lines[2]]) + "\n")
    with pytest.raises(ToolfidError, match=rf"{bad}:2: not valid JSON"):
        convert(bad, names_only=True)
    broken = tmp_path / "BFCL_v4_simple.json"
    q0 = json.loads(lines[0])
    q0["function"] = {"name": "not a list"}
    broken.write_text(json.dumps(q0) + "\n")
    with pytest.raises(ToolfidError, match=rf"{broken}:1: 'function' must be a list"):
        convert(broken, names_only=True)
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"id": "nope", "ground_truth": [{"x": {}}]}) + "\n")
    single = tmp_path / "BFCL_v4_parallel.json"
    single.write_text(lines[0] + "\n")
    with pytest.raises(ToolfidError, match=rf"{single}:1: question .* has no entry in {answers}"):
        convert(single, answers)
    with pytest.raises(ToolfidError, match="not supported"):
        convert(tmp_path / "BFCL_v4_exec_simple.json")

    assert cli.main(["import-bfcl", str(q), "--output", str(tmp_path / "o.jsonl")]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs its answers file" in err and not (tmp_path / "o.jsonl").exists()


def test_several_files_with_the_answers_folder(tmp_path, capsys):
    out = tmp_path / "mix.jsonl"
    names = ["BFCL_v4_parallel.json", "BFCL_v4_irrelevance.json"]
    assert cli.main(["import-bfcl", *(str(BFCL / n) for n in names), "--answers", str(BFCL / "possible_answer"),
                     "-o", str(out)]) == 0
    cases = load_cases(out)
    assert {c.category for c in cases} == {"parallel", "irrelevance"}
    assert len(cases) == sum(len(_lines(BFCL / n)) for n in names)
    assert "wrote" in capsys.readouterr().out


def _derived(tmp_path: Path, source: str, name: str, edit) -> tuple[Path, list[dict]]:
    """A copy of a real file under another name, ``edit(index, entry)`` applied to each entry."""
    entries = _lines(BFCL / source)
    for i, entry in enumerate(entries):
        edit(i, entry)
    path = tmp_path / name
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path, entries


def test_questions_with_no_function_become_irrelevance_cases_with_no_tools(tmp_path, capsys):
    """BFCL's live_irrelevance has questions with ``"function": []`` (4 of 884 in BFCL v4); one such line
    used to stop the import of the whole file. Here: the real irrelevance questions, every tenth one's
    functions emptied, under the live_irrelevance file name."""
    def empty(i, entry):
        if i % 10 == 0:
            entry["function"] = []
    path, entries = _derived(tmp_path, "BFCL_v4_irrelevance.json", "BFCL_v4_live_irrelevance.json", empty)
    target = tmp_path / "live_irrelevance.jsonl"
    line = _import("BFCL_v4_live_irrelevance.json", path, target, capsys)
    assert line == f"wrote {len(entries)} cases (live_irrelevance {len(entries)}) to {target}"
    cases = load_cases(target)
    assert [c.id for c in cases] == [e["id"] for e in entries]
    no_tools = [c for c in cases if not c.tools]
    assert [c.id for c in no_tools] == [e["id"] for e in entries if not e["function"]] and len(no_tools) == 24
    assert all(c.irrelevant and c.expected_calls == [] and c.category == "live_irrelevance" for c in cases)
    assert all(c.prompt == e["question"][0][-1]["content"].strip() for c, e in zip(cases, entries))


def test_entries_that_cannot_be_cases_are_skipped_and_counted(tmp_path, capsys):
    """Never the whole file for one entry: what cannot be a case is skipped, counted by reason on the
    summary line (and named with --verbose)."""
    def odd(i, entry):
        if i == 3:
            entry["function"] = []  # a call is expected, nothing is offered
        elif i in (5, 6):  # a conversation (as 8 live_irrelevance questions are): imported, with a history
            entry["question"][0][1:1] = [{"role": "assistant", "content": "Which unit?"},
                                         {"role": "user", "content": "Metres."}]
        elif i == 7:
            entry["question"] = entry["question"] * 2
        elif i == 8:  # a conversation that ends with the assistant: no next step to ask for
            entry["question"][0].append({"role": "assistant", "content": "Done."})
        elif i == 9:
            entry["function"][0]["parameters"]["properties"] = {"x": {"type": "HashMap"}}  # a Java type name
    path, entries = _derived(tmp_path, "BFCL_v4_simple_python.json", "BFCL_v4_simple_python.json", odd)
    target = tmp_path / "out.jsonl"
    capsys.readouterr()
    assert cli.main(["import-bfcl", str(path), "--answers", str(_answers("BFCL_v4_simple_python.json")),
                     "-o", str(target), "--verbose"]) == 0
    captured = capsys.readouterr()
    n = len(entries) - 4
    assert captured.out == (f"wrote {n} cases (simple_python {n}) to {target}; skipped 4 (a call expected but no "
                            "function offered: 1, several turns: 1, conversation a case cannot hold: 1, "
                            "tool schema not JSON Schema: 1)\n")
    assert f"{path}:4: no function offered" in captured.err
    assert f"{path}:9: the conversation ends with an assistant message" in captured.err
    assert "'HashMap' is not valid" in captured.err
    skipped = {entries[i]["id"] for i in (3, 7, 8, 9)}
    cases = load_cases(target)
    assert [c.id for c in cases] == [e["id"] for e in entries if e["id"] not in skipped]
    talks = [c for c in cases if c.history]
    assert [c.id for c in talks] == [entries[5]["id"], entries[6]["id"]]
    for c in talks:  # the request before the assistant's question is the prompt; a call is still expected
        assert [(m.role, m.content) for m in c.history] == [("assistant", "Which unit?"), ("user", "Metres.")]
        assert c.turn_depth == 2 and c.expected_calls and "Which unit?" not in c.prompt

    def everything(i, entry):
        entry["function"] = []
    path, _ = _derived(tmp_path, "BFCL_v4_simple_python.json", "BFCL_v4_simple_python.json", everything)
    assert cli.main(["import-bfcl", str(path), "--names-only", "-o", str(tmp_path / "none.jsonl")]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no entry could be imported (skipped 400: a call expected" in err
    assert not (tmp_path / "none.jsonl").exists()


def test_a_conversation_becomes_the_prompt_and_a_history():
    """Before the first assistant message: the prompt (system text first); from it on: the history, consecutive
    user messages as one turn, empty messages left out. What a case cannot hold is skipped, saying why."""
    from lm_eval_toolfid.cases.bfcl import SKIP_CONVERSATION, Skip, conversation_of

    def msg(role, content):
        return {"role": role, "content": content}

    prompt, history = conversation_of([[msg("user", "hi "), msg("system", "Be terse."), msg("assistant", " Hello! "),
                                        msg("user", "weather?"), msg("user", ""), msg("user", "in Oslo"),
                                        msg("assistant", ""), msg("assistant", "Which day?"), msg("user", "today")]], "f:1")
    assert prompt == "Be terse.\n\nhi"
    assert history == [msg("assistant", "Hello!"), msg("user", "weather?\n\nin Oslo"), msg("assistant", "Which day?"),
                       msg("user", "today")]
    assert conversation_of([[msg("user", "hi")]], "f:1") == ("hi", [])
    for question, why in (([msg("assistant", "Hi!"), msg("user", "hi")], "opens with an assistant message"),
                          ([msg("user", "hi"), msg("assistant", "Hi!")], "ends with an assistant message"),
                          ([msg("user", "hi"), msg("assistant", "Hi!"), msg("system", "x"), msg("user", "y")],
                           "a system message after an assistant message")):
        with pytest.raises(Skip, match=why) as skip:
            conversation_of([question], "f:7")
        assert skip.value.reason == SKIP_CONVERSATION and str(skip.value).startswith("f:7: ")
    with pytest.raises(ToolfidError, match="f:2: message role 'tool' is not supported"):
        conversation_of([[msg("user", "hi"), msg("assistant", "Hi!"), msg("tool", "x")]], "f:2")


@pytest.mark.parametrize("category,why", [
    ("multi_turn_base", "executing BFCL's stateful tool back-ends"),
    ("multi_turn_miss_func", "depends on the execution results of the turns before it"),
    ("memory", "memory back-end"),
    ("web_search", "live web searches"),
    ("live_relevance", "no expected call is given"),
])
def test_multi_turn_and_agentic_categories_are_refused_saying_why(tmp_path, capsys, category, why):
    path = tmp_path / f"BFCL_v4_{category}.json"
    path.write_text((BFCL / "BFCL_v4_simple_python.json").read_text().splitlines()[0] + "\n")
    assert cli.main(["import-bfcl", str(path), "-o", str(tmp_path / "o.jsonl")]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err and "cannot be imported" in err and str(path) in err
