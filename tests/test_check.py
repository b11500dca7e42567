"""``toolfid check``: scoring generations without a model, through the installed CLI."""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.cases.load import load_cases

from .lm_eval_helpers import BIN, lm_eval_cli, metrics, read_run

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


def check(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([TOOLFID, "check", *args], input=stdin, capture_output=True, text=True, timeout=120)


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
    proc = lm_eval_cli(f"pretrained={fix['base']},peft={fix['adapters']['broken']}", tmp_path / "run",
                       tmp_path / "home", metadata={"cases": str(cases)})
    assert proc.returncode == 0, proc.stderr[-3000:]
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
