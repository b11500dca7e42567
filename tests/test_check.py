"""``toolfid check``: scoring generations without a model (the CLI entry point in process; the installed console
script where stdin, streaming and pipes are what is tested)."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.cli import main

from .conftest import SHARED
from .lm_eval_helpers import BIN, lm_eval_in_process, metrics, read_run

TOOLFID = str(BIN / "toolfid")
HAS_FORMATS = importlib.util.find_spec("lm_eval_toolfid.formats") is not None
TOOLS = [{"name": "get_weather", "description": "Current weather",
          "parameters": {"type": "object", "required": ["city"],
                         "properties": {"city": {"type": "string"},
                                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}]
CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
J = json.dumps(CALL)

# One hand-written example per output format, with what today's parser (lm_eval_toolfid.formats:
# whole text, fenced block, first balanced object) makes of it: (kind, keyword, format of the call).
EXAMPLES = {
    "bare_json": (J, ("valid", None, "bare_json")),
    "fenced": (f"Here you go:\n```json\n{J}\n```", ("valid", None, "fenced")),
    "embedded": (f"Sure, I'll call {J} now.", ("valid", None, "embedded")),
    "hermes": (f"<tool_call>\n{J}\n</tool_call>", ("valid", None, "embedded")),
    "llama": ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
              ("wrong_shape", "arguments", "embedded")),
    "mistral": (f"[TOOL_CALLS] [{J}]", ("valid", None, "embedded")),
    "openai": (json.dumps({"name": "get_weather", "arguments": json.dumps(CALL["arguments"])}),
               ("wrong_shape", "arguments_string", "bare_json")),
    "pythonic": ('[get_weather(city="Paris", unit="celsius")]', ("no_call", None, None)),
    "qwen3_coder": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                    "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>", ("no_call", None, None)),
}


def check_console(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The installed console script in its own process (stdin a real pipe)."""
    return subprocess.run([TOOLFID, "check", *args], input=stdin, capture_output=True, text=True, timeout=120)


def check(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``toolfid check ARGS`` through the CLI's entry point in this process (what it computes and prints, without
    a new interpreter's imports); stdin, when given, is what the command reads. The console script itself:
    :func:`check_console` (stdin, pipes, streaming)."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, redirect_stdout(out), redirect_stderr(err):
        mp.setattr(sys, "stdin", io.StringIO(stdin or ""))
        try:
            code = main(["check", *args])
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(["toolfid", "check", *args], code, out.getvalue(), err.getvalue())


def _examples() -> dict[str, tuple[str, tuple]]:
    if not HAS_FORMATS:
        return EXAMPLES
    from lm_eval_toolfid import formats  # the format parsers: every renderable format must round-trip
    from lm_eval_toolfid.core.records import SurfaceFormat

    out = {}
    for fmt in SurfaceFormat:
        try:
            text = formats.render_call(CALL["name"], CALL["arguments"], fmt)
        except (ValueError, NotImplementedError, KeyError):
            continue
        out[fmt.value] = (text, ("valid", None, fmt.value))
    assert len(out) >= 6, out
    return out


def test_every_format_example_gets_its_format_and_outcome():
    examples = _examples()
    lines = [json.dumps({"id": name, "text": text, "tools": TOOLS, "gold_tool_name": "get_weather"})
             for name, (text, _) in examples.items()]
    proc = check("--json", stdin="\n".join(lines) + "\n")
    assert proc.returncode == 0, proc.stderr  # every format parses into a valid call
    payload = json.loads(proc.stdout)
    got = {r["case_id"]: (r["kind"], r["keyword"], r["format"]) for r in payload["results"]}
    assert got == {name: expected for name, (_, expected) in examples.items()}
    for r in payload["results"]:
        if r["kind"] == "valid":
            assert r["name"] == "get_weather" and r["arguments"] == CALL["arguments"] and r["hallucinated"] is False
            assert [c["format"] for c in r["calls"]] == [r["format"]]
    summary = payload["summary"]
    n_valid = sum(e[0] == "valid" for _, e in examples.values())
    assert summary["n"] == len(examples) and summary["json_valid_rate"] == pytest.approx(n_valid / len(examples))


def test_schema_error_reports_keyword_and_path_and_exit_codes(tmp_path):
    tools = json.dumps(TOOLS)
    bad = json.dumps({"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}})
    proc = check(bad, "--tools", tools, "--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 1
    assert (out["kind"], out["keyword"], out["path"]) == ("schema_error", "enum", "unit")
    assert "kelvin" in out["message"] and not out["message"].endswith(" at unit")
    proc = check(bad, "--tools", tools)  # human-readable
    assert proc.returncode == 1 and proc.stdout.startswith("input: SCHEMA_ERROR keyword=enum at unit:")

    good = tmp_path / "gen.txt"
    good.write_text(f"<tool_call>\n{J}\n</tool_call>")
    spec = tmp_path / "tools.json"
    spec.write_text(tools)
    proc = check("--file", str(good), "--tools", str(spec), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["kind"] == "valid"
    halluc = json.dumps({"name": "get_wether", "arguments": {"city": "Paris"}})
    out = json.loads(check(halluc, "--tools", tools, "--json").stdout)
    assert out["kind"] == "valid" and out["hallucinated"] is True

    # no tools given: the shape is checked, the schema is not
    out = json.loads(check(J, "--json").stdout)
    assert out["kind"] == "valid" and out["schema_checked"] is False
    # a case of a case file, by id
    case = load_cases("fixture")[0]
    call = json.dumps({"name": case.gold_tool_name, "arguments": case.gold_arguments})
    assert check(call, "--case", case.id, "--cases", "fixture").returncode == 0

    for argv, stdin, message in [
        ((J, "--file", str(good)), None, "give one input"),
        ((J, "--tools", "[not json"), None, "--tools"),
        ((J, "--case", "nope", "--cases", "fixture"), None, "'nope' is not in the case file"),
        (("--samples", str(tmp_path / "missing.jsonl")), None, "samples file not found"),
        ((), '{"text": 1}\n', "<stdin>:1:"),
        ((), '{"case_id": "zz", "text": "x"}\n', "--cases"),
    ]:
        proc = check(*argv, stdin=stdin if stdin is not None else "")
        assert proc.returncode == 4, (argv, proc.stdout, proc.stderr)  # input error
        assert message in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_samples_rescoring_matches_the_lm_eval_run(tmp_path):
    """Re-scoring a real run's samples file reproduces the run's own metrics, case by case."""
    fix = fixture_paths()
    cases = tmp_path / "cases.jsonl"
    subset = load_cases("fixture")[:12]
    cases.write_text("".join(json.dumps(c.model_dump(mode="json", exclude_none=True)) + "\n" for c in subset))
    # the run in this process (its samples file is what is re-scored), then `check` in this process too
    code, err = lm_eval_in_process(f"pretrained={fix['base']},peft={fix['adapters']['broken']}", tmp_path / "run",
                                   tmp_path / "home", metadata={"cases": str(cases)})
    assert code == 0, err[-3000:]
    results, samples = read_run(tmp_path / "run")
    samples_file = sorted((tmp_path / "run").rglob("samples_*.jsonl"))[-1]
    proc = check("--samples", str(samples_file), "--cases", str(cases), "--json")
    assert proc.returncode in (0, 1), proc.stderr
    payload = json.loads(proc.stdout)
    m = metrics(results)
    for key in ("json_valid_rate", "parse_rate", "hallucination_rate", "name_hallucination_rate", "gold_tool_rate"):
        # a metric with no case in its denominator is absent from lm-eval's results and None here
        expected = pytest.approx(m[key]) if key in m else None
        assert payload["summary"][key] == expected, key
    by_id = {r["case_id"]: r for r in payload["results"]}
    assert set(by_id) == {s["doc"]["id"] for s in samples}
    for s in samples:
        assert (by_id[s["doc"]["id"]]["kind"] == "valid") == bool(s["json_valid_rate"])
    assert payload["summary"]["json_valid_rate"] < 1.0  # the broken adapter answers in prose
    proc = check("--samples", str(samples_file), "--cases", str(cases))
    assert f"{len(samples)} generations: json_valid_rate" in proc.stdout


# --- stdin, gold values, streaming -------------------------------------------------------------

HERMES_CALL = f"<tool_call>\n{J}\n</tool_call>"


def test_dash_reads_one_generation_from_stdin(tmp_path):
    """``check -`` and ``--file -`` read the generation from standard input (``-`` used to be taken
    as the generation text itself). Through the console script with a real pipe: both spellings and empty stdin's
    exit code; the rest of what is read how goes through the same entry point in this process (``check``: stdin
    is what the command reads), without an interpreter start each."""
    tools = json.dumps(TOOLS)
    for argv in (("-",), ("--file", "-")):
        proc = check_console(*argv, "--tools", tools, "--json", stdin=HERMES_CALL)
        assert proc.returncode == 0, (argv, proc.stdout, proc.stderr)
        out = json.loads(proc.stdout)
        assert (out["kind"], out["name"], out["arguments"]) == ("valid", "get_weather", CALL["arguments"])
        # a multi-line generation is one text, even when its lines look like JSONL
        two = check(*argv, "--tools", tools, "--json", stdin=J + "\n" + json.dumps({"text": "x"}) + "\n")
        assert json.loads(two.stdout)["n_calls"] >= 1 and "results" not in json.loads(two.stdout)
    # empty stdin is an input error in one line; an empty generation is checked as ''
    for argv, run in ((("-",), check_console), (("--file", "-"), check)):
        proc = run(*argv, "--tools", tools, stdin="")
        assert proc.returncode == 4 and proc.stderr.count("\n") == 1 and "<stdin>: empty" in proc.stderr
    proc = check("", "--tools", tools, "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["kind"] == "no_call"
    # '-' and JSONL on stdin: JSONL is read only when no TEXT is given
    lines = json.dumps({"text": J, "tools": TOOLS, "gold_tool_name": "get_weather"}) + "\n"
    assert json.loads(check("--json", stdin=lines * 2).stdout)["summary"]["n"] == 2
    assert check("-", "--file", str(tmp_path / "x"), stdin=J).returncode == 4


def _bfcl_case_file(tmp_path):
    """simple_python, parallel and irrelevance from ../shared/bfcl through the real import."""
    from lm_eval_toolfid import cli

    from .test_bfcl_import import BFCL

    out = tmp_path / "bfcl.jsonl"
    names = ["BFCL_v4_simple_python.json", "BFCL_v4_parallel.json", "BFCL_v4_irrelevance.json"]
    assert cli.main(["import-bfcl", *(str(BFCL / n) for n in names), "--answers", str(BFCL / "possible_answer"),
                     "-o", str(out)]) == 0
    return out, load_cases(out)


def _generations(cases):
    """``{"case_id", "text"}`` lines: reference answers, every third one with a wrong first value, prose
    for irrelevance cases; with what gold_args must be for each."""
    from lm_eval_toolfid.cases.bfcl import reference_arguments

    lines, expected = [], {}
    for i, case in enumerate(cases):
        if case.irrelevant:
            lines.append({"case_id": case.id, "text": "That is not something these tools do."})
            expected[case.id] = None
            continue
        calls = [{"name": g.name, "arguments": reference_arguments(g.options)} for g in case.expected_calls]
        if any(opts == [] for g in case.expected_calls for opts in g.options.values()):
            continue  # BFCL gives no acceptable value for a parameter: no answer can match
        wrong = i % 3 == 0 and bool(calls[0]["arguments"])
        if wrong:
            key = next(iter(calls[0]["arguments"]))
            calls[0]["arguments"][key] = "zz-not-an-option"
        lines.append({"case_id": case.id, "text": json.dumps(calls if len(calls) > 1 else calls[0])})
        expected[case.id] = not wrong
    return lines, expected


@pytest.mark.skipif(not (SHARED / "bfcl").is_dir(), reason="../shared/bfcl not present")
def test_records_carry_gold_values_so_bfcl_answers_rescore_without_a_model(tmp_path):
    path, cases = _bfcl_case_file(tmp_path)
    lines, expected = _generations(cases)
    stdin = "".join(json.dumps(x) + "\n" for x in lines)
    proc = check("--cases", str(path), "--json", stdin=stdin)
    assert proc.returncode == 1, proc.stderr  # wrong values and irrelevance answers are not valid calls
    payload = json.loads(proc.stdout)
    got = {r["case_id"]: r["gold_args"] for r in payload["results"]}
    assert got == expected
    tools = {r["case_id"]: r["gold_tool"] for r in payload["results"]}
    assert all(tools[c] is (None if e is None else True) for c, e in expected.items())
    judged = [v for v in expected.values() if v is not None]
    summary = payload["summary"]
    assert summary["gold_args_match_rate"] == pytest.approx(sum(judged) / len(judged))
    assert summary["denominators"]["gold_args_match_rate"] == len(judged) > 500
    assert summary["false_call_rate"] == 0.0 and summary["gold_tool_rate"] == 1.0
    # the same in text: each line says it, the summary has the rate
    text = check("--cases", str(path), stdin=stdin).stdout.splitlines()
    wrong = next(c for c, e in expected.items() if e is False)
    right = next(c for c, e in expected.items() if e is True)
    assert next(x for x in text if x.startswith(f"{wrong}: ")).endswith("gold_tool=yes gold_args=no")
    assert "gold_tool=yes gold_args=yes" in next(x for x in text if x.startswith(f"{right}: "))
    assert f"gold_args_match_rate {sum(judged) / len(judged):.3f}" in text[-1]


def test_gold_arguments_of_a_case_are_checked_exactly():
    case = next(c for c in load_cases("fixture") if c.gold_arguments)
    good = json.dumps({"name": case.gold_tool_name, "arguments": case.gold_arguments})
    out = json.loads(check(good, "--case", case.id, "--cases", "fixture", "--json").stdout)
    assert (out["kind"], out["gold_tool"], out["gold_args"]) == ("valid", True, True)
    changed = {**case.gold_arguments, next(iter(case.gold_arguments)): "something else"}
    bad = json.dumps({"name": case.gold_tool_name, "arguments": changed})
    out = json.loads(check(bad, "--case", case.id, "--cases", "fixture", "--json").stdout)
    assert (out["gold_tool"], out["gold_args"]) == (True, False)
    # no case, no gold: nothing is expected of a shape-only check
    out = json.loads(check(J, "--json").stdout)
    assert (out["gold_tool"], out["gold_args"], out["hallucinated"]) == (None, None, None)
    assert check("--tools", json.dumps(TOOLS), stdin="").returncode == 4


def _read_line(stream, seconds: float = 60.0) -> str:
    """One line from a pipe, or fail after ``seconds`` (the writer has not flushed it)."""
    import threading

    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(seconds)
    assert box, f"no output line within {seconds}s"
    return box[0]


def test_jsonl_writes_each_record_as_it_is_scored_then_a_summary():
    cases = [c for c in load_cases("fixture")][:5]
    lines = [json.dumps({"case_id": c.id, "text": json.dumps({"name": c.gold_tool_name,
                                                             "arguments": c.gold_arguments or {}})})
             for c in cases] + [json.dumps({"case_id": cases[0].id, "text": "no call here"})]
    proc = subprocess.Popen([TOOLFID, "check", "--cases", "fixture", "--jsonl"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    try:
        proc.stdin.write(lines[0] + "\n")
        proc.stdin.flush()
        first = json.loads(_read_line(proc.stdout))  # stdin is still open: the record came out already
        assert first["case_id"] == cases[0].id and "summary" not in first
        proc.stdin.write("".join(x + "\n" for x in lines[1:]))
        proc.stdin.close()
        rest = [json.loads(x) for x in proc.stdout.read().splitlines()]
        assert proc.wait(60) == 1  # the last generation is not a call
    finally:
        proc.kill()
    records, summary = [first, *rest[:-1]], rest[-1]
    assert set(summary) == {"summary"} and summary["summary"]["n"] == len(lines)
    whole = json.loads(check("--cases", "fixture", "--json", stdin="\n".join(lines) + "\n").stdout)
    assert records == whole["results"] and summary["summary"] == whole["summary"]
    one = check("-", "--tools", json.dumps(TOOLS), "--jsonl", stdin=J).stdout.splitlines()
    assert len(one) == 2 and json.loads(one[0])["kind"] == "valid"
    assert json.loads(one[1])["summary"]["json_valid_rate"] == 1.0
    assert check("--json", "--jsonl", J).returncode == 4


def test_a_reader_that_goes_away_ends_the_output_quietly(tmp_path):
    """`toolfid check --jsonl < big | head -1`: no traceback, no "internal error", exit 141 (128 + SIGPIPE)."""
    import subprocess
    import sys
    from pathlib import Path

    line = json.dumps({"text": J, "tools": TOOLS, "gold_tool_name": "get_weather"}) + "\n"
    (tmp_path / "in.jsonl").write_text(line * 4000)
    with open(tmp_path / "in.jsonl") as stdin:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "toolfid"), "check", "--jsonl"], stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout.readline().startswith(b"{")
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=300) == 141 and err == "", err


def test_the_exit_status_says_whether_the_answer_is_what_the_case_expects(tmp_path):
    """0 for a valid call where one is expected and for no call on an irrelevance case; 1 for the rest (a call on
    an irrelevance case, a malformed attempt there too: the task's false-call rule); the line says which."""
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps({"id": "irr", "prompt": "Tell me a joke.", "tools": TOOLS, "gold_tool_name": None})
                     + "\n" + json.dumps({"id": "w", "prompt": "Weather in Paris?", "tools": TOOLS,
                                          "gold_tool_name": "get_weather"}) + "\n")
    prose = check("Why did the chicken cross the road?", "--cases", str(cases), "--case", "irr")
    assert prose.returncode == 0, prose.stdout + prose.stderr
    assert prose.stdout == "irr: NO_CALL (no call: what this irrelevance case expects)\n" and prose.stderr == ""
    called = check(J, "--cases", str(cases), "--case", "irr")
    assert called.returncode == 1 and called.stdout.startswith("irr: VALID get_weather")
    assert called.stdout.rstrip().endswith("(this irrelevance case expects no call)")
    attempt = check('{"name": "get_weather", "arguments": {', "--cases", str(cases), "--case", "irr", "--json")
    assert attempt.returncode == 1 and json.loads(attempt.stdout)["as_expected"] is False
    assert check("It is sunny.", "--cases", str(cases), "--case", "w").returncode == 1  # a call was expected
    assert check("It is sunny.", "--tools", "[]").returncode == 0  # no tool offered: no call expected
    valid = check(J, "--cases", str(cases), "--case", "w", "--json")
    assert valid.returncode == 0 and json.loads(valid.stdout)["as_expected"] is True
    # a stream: 0 only when every answer is as expected
    lines = "".join(json.dumps({"case_id": cid, "text": text}) + "\n" for cid, text in (("irr", "No."), ("w", J)))
    assert check("--cases", str(cases), stdin=lines).returncode == 0
    assert check("--cases", str(cases), stdin=lines + json.dumps({"case_id": "irr", "text": J}) + "\n"
                 ).returncode == 1


def test_the_printed_example_of_docs_check_md_is_what_check_prints(tmp_path, monkeypatch):
    """docs/check.md's output block, against what the command prints for its command line (run here)."""
    from .doc_output import REPO, mismatches, printed_blocks

    [block] = [b for b in printed_blocks(REPO / "docs" / "check.md") if b.source == "toolfid check with tools.json"]
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    monkeypatch.chdir(tmp_path)
    proc = check('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}</tool_call>',
                 "--tools", "tools.json")
    assert proc.returncode == 1 and proc.stderr == ""
    assert mismatches(block, proc.stdout) == []
