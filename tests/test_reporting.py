"""Fast tests of the reporting layer: loading, leaderboard, breakdowns, HTML, JUnit/gate, CLI contract."""

from __future__ import annotations

import ast
import csv
import io
import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from lm_eval_toolfid.cli import build_parser, main
from lm_eval_toolfid.core.errors import ToolfidError, guard
from lm_eval_toolfid.reporting import collect
from lm_eval_toolfid.reporting.breakdown import breakdown
from lm_eval_toolfid.reporting.gate import exit_code, junit_xml
from lm_eval_toolfid.reporting.leaderboard import (format_csv, format_json, format_leaderboard_table, format_markdown,
                                                   sort_rows)
from lm_eval_toolfid.reporting.load import load_runs, parse_model_args, read_run, wilson
from lm_eval_toolfid.reporting.progress import Progress, _Bar

from .reporting_helpers import case, gate, outcome, verdict, write_run

V = outcome("valid")
REQ = outcome("schema_error", keyword="required", detail="'city' is a required property", arguments={})


def _cases(n_regress: int, n_same: int = 4, tool: str = "get_weather") -> list[dict]:
    out = [case(f"r{i}", tool, V, REQ) for i in range(n_regress)]
    out += [case(f"s{i}", "get_time", V, V) for i in range(n_same)]
    return out


def test_model_args_string_and_dict():
    assert parse_model_args("pretrained=/m,peft=/a,dtype=float16") == {"pretrained": "/m", "peft": "/a",
                                                                         "dtype": "float16"}
    assert parse_model_args({"pretrained": "/m", "peft": None}) == {"pretrained": "/m"}


def test_both_layouts_are_read_with_their_samples(tmp_path):
    a = write_run(tmp_path / "run" / "a1", _cases(2), layout="toolfid")
    b = write_run(tmp_path / "lm" / "model", _cases(1), adapter="/ad/a2", layout="lm_eval",
                  model_args_as_string=True)
    ra, rb = read_run(a), read_run(b)
    assert ra.label == "a1" and ra.samples_path == a.with_name("samples.jsonl")
    assert rb.label == "a2" and rb.adapter == "/ad/a2" and rb.samples_path.name.startswith("samples_")
    assert ra.metrics["validity_delta"] == pytest.approx(-2 / 6)
    lo, hi = ra.ci("validity_delta")  # ±1.96·stderr from the results file
    assert lo == pytest.approx(-2 / 6 - 1.96 * 0.05) and hi == pytest.approx(-2 / 6 + 1.96 * 0.05)
    assert ra.ci("json_valid_rate") == pytest.approx(wilson(4 / 6, 6))


def test_compare_intervals_stay_inside_each_metrics_range(tmp_path):
    """A rate near 1 with lm-eval's stderr would give ``0.800 [0.54,1.06]`` (±1.96·se): rates get Wilson's
    interval over their denominator, a delta's stderr interval is cut to [-1, 1]; the table shows them so."""
    import json

    from lm_eval_toolfid.reporting.leaderboard import build, cell

    path = write_run(tmp_path / "run" / "a1", _cases(1, n_same=4))
    data = json.loads(path.read_text())
    res = data["results"][next(iter(data["results"]))]
    res.update({"json_valid_rate,none": 0.8, "json_valid_rate_stderr,none": 0.13, "validity_delta,none": -0.95,
                "validity_delta_stderr,none": 0.2, "gold_tool_rate,none": 0.98, "gold_tool_rate_stderr,none": 0.05})
    data["configs"][next(iter(data["configs"]))]["metadata"]["toolfid"]["summary"] = {
        "denominators": {"json_valid_rate": 5, "gold_tool_rate": 50}}
    path.write_text(json.dumps(data))
    run = read_run(path)
    assert run.ci("json_valid_rate") == pytest.approx(wilson(0.8, 5))
    assert run.ci("gold_tool_rate") == pytest.approx(wilson(0.98, 50))
    assert run.ci("validity_delta") == pytest.approx((-1.0, -0.95 + 1.96 * 0.2))
    for metric in ("json_valid_rate", "gold_tool_rate", "validity_delta"):
        lo, hi = run.ci(metric)
        assert (-1.0 if metric.endswith("delta") else 0.0) <= lo <= hi <= 1.0, metric
    row = build([run]).rows[0]
    assert cell(row, "json_valid_rate", True) == "0.800 [%.2f,%.2f]" % wilson(0.8, 5)


def test_groups_that_differ_only_in_dtype_are_headed_by_it(tmp_path):
    """The same base folder in float32 and in bfloat16 is two groups (they never pair); each heading names the
    dtype, and the JSON says why the second stands apart."""
    import json

    from lm_eval_toolfid.reporting.leaderboard import build, format_json, format_leaderboard_table

    runs = []
    for dtype, date in (("float32", 1.0), ("bfloat16", 2.0)):
        path = write_run(tmp_path / dtype / "a1", _cases(1), date=date)
        data = json.loads(path.read_text())
        data["configs"][next(iter(data["configs"]))]["metadata"]["toolfid"]["run_key"]["base"]["dtype"] = dtype
        path.write_text(json.dumps(data))
        runs.append(read_run(path))
    board = build(runs)
    assert [g.title.split(" · ")[-1] for g in board.groups] == ["dtype float32", "dtype bfloat16"]
    text = format_leaderboard_table(board)
    assert "dtype float32" in text and "dtype bfloat16" in text
    groups = json.loads(format_json(board))["groups"]
    assert "another dtype (bfloat16)" in groups[1]["why"] and groups[1]["facets"]["dtype"] == "bfloat16"


def test_duplicate_runs_are_counted_once(tmp_path):
    src = write_run(tmp_path / "x" / "a1", _cases(1))
    copy = tmp_path / "y" / "a1"
    copy.mkdir(parents=True)
    for f in src.parent.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    runs, notes = load_runs([tmp_path / "x", tmp_path / "y", src])
    assert len(runs) == 1 and len(notes) == 1 and "counted once" in notes[0]


def test_leaderboard_groups_merges_other_tasks_and_sorts(tmp_path):
    write_run(tmp_path / "r" / "good", _cases(0), adapter="/ad/good", verdict=verdict(gate("validity_delta", 0.0, True)))
    write_run(tmp_path / "r" / "bad", _cases(3), adapter="/ad/bad",
              verdict=verdict(gate("validity_delta", -0.4, False)))
    # the same adapter scored on another case set: a separate group
    write_run(tmp_path / "r" / "bad-other", _cases(1), adapter="/ad/bad", case_set="cs2", date=2.0)
    # an ordinary lm_eval run of another task with the good adapter joins its row
    write_run(tmp_path / "lm" / "m", _cases(0), adapter="/ad/good", layout="lm_eval",
              other_tasks={"arc_easy": {"acc,none": 0.625, "acc_stderr,none": 0.1, "acc_norm,none": 0.7}}, date=3.0,
              toolfid_task=False)
    _, board, _ = collect([tmp_path / "r", tmp_path / "lm"])
    assert len(board.groups) == 2
    assert "another case set" in board.groups[1].why
    first = board.groups[0]
    labels = {r.label for r in first.rows}
    assert labels == {"bad", "good"}
    good = next(r for r in first.rows if r.adapter == "/ad/good")
    assert good.others["arc_easy"] == ("acc", 0.625)
    sort_rows(board, "validity_delta")
    assert [r.adapter for r in board.groups[0].rows] == ["/ad/good", "/ad/bad"]
    table = format_leaderboard_table(board)
    assert "arc_easy" in table and "0.625 (acc)" in table and "FAIL" in table
    assert "name halluc" not in table  # columns nobody has are left out of the terminal table
    md = format_markdown(board)
    assert md.count("\n|") >= 6 and "—" in md
    rows = list(csv.DictReader(io.StringIO(format_csv(board))))
    bad = next(r for r in rows if r["adapter"] == "/ad/bad" and r["case_set"] == "cs1")
    assert float(bad["validity_delta"]) == pytest.approx(-3 / 7) and bad["name_hallucination_rate"] == ""
    data = json.loads(format_json(board))
    assert {r["verdict"] for r in data["rows"]} >= {"PASS", "FAIL"}
    with pytest.raises(ToolfidError, match="unknown column"):
        sort_rows(board, "nope")


def test_breakdown_per_tool_kinds_drift_and_worst_first(tmp_path):
    fenced = outcome("valid", surface="fenced")
    cases = [case("a", "get_weather", V, REQ, text='{"name": "get_weather", "arguments": {}}'),
             case("b", "get_weather", V, fenced),
             case("c", "get_time", REQ, REQ),
             case("d", "get_time", V, outcome("valid", name="launch_rocket", hallucinated=True))]
    run = read_run(write_run(tmp_path / "a", cases))
    b = breakdown(run)
    tools = {t.tool: (t.cases, t.base_valid, t.ft_valid) for t in b.tools}
    assert tools == {"get_weather": (2, 2, 1), "get_time": (2, 1, 1)}
    kinds = {k: (bc, fc) for k, bc, fc in b.kinds}
    assert kinds["schema_error:required"] == (1, 2) and kinds["valid"] == (3, 2)
    assert b.drift == [("bare_json", "fenced", 1)]
    worst = b.worst(10)
    assert [c.case_id for c in worst] == ["a", "c", "d"]
    assert worst[0].category == "regression" and worst[2].category == "hallucinated tool"


def test_html_escapes_model_output_and_has_plots(tmp_path):
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    cases = [case("a", "get<b>weather</b>", V, REQ, text=evil, prompt="<iframe src=//evil>")] + _cases(0, 3)
    write_run(tmp_path / "r" / "a1", cases, verdict=verdict(gate("validity_delta", -0.25, False)))
    from lm_eval_toolfid.reporting import html

    _, board, bds = collect([tmp_path / "r"])
    page = html.render(board, bds)
    assert "<script" not in page and "<iframe" not in page and "<img" not in page and "<b>weather" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page

    class Tags(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[str] = []

        def handle_starttag(self, tag, attrs):  # noqa: ANN001
            self.tags.append(tag)

    parser = Tags()
    parser.feed(page)
    assert parser.tags.count("svg") >= 3 and "rect" in parser.tags and "table" in parser.tags
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched


def test_gate_exit_codes_and_junit(tmp_path, capsys):
    p = write_run(tmp_path / "p" / "a", _cases(0), verdict=verdict(gate("validity_delta", 0.0, True),
                                                                   gate("hallucination_rate", 0.0, True, "<=", 0.1)))
    f = write_run(tmp_path / "f" / "b", _cases(2), adapter="/ad/b",
                  verdict=verdict(gate("validity_delta", -0.33, False), gate("hallucination_rate", 0.0, True, "<=", 0.1)))
    u = write_run(tmp_path / "u" / "c", _cases(0), adapter="/ad/c",
                  verdict=verdict(gate("validity_delta", None, None), gate("hallucination_rate", 0.0, True, "<=", 0.1)))
    runs = {k: load_runs([v])[0] for k, v in {"p": p, "f": f, "u": u}.items()}
    assert exit_code(runs["p"]) == 0
    assert exit_code(runs["p"] + runs["u"]) == 2
    assert exit_code(runs["p"] + runs["u"] + runs["f"]) == 1
    root = ET.fromstring(junit_xml(runs["p"] + runs["u"] + runs["f"]))
    cases = root.findall(".//testcase")
    assert len(cases) == 6 and root.get("tests") == "6"
    failed = [c for c in cases if c.find("failure") is not None]
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert [(c.get("classname"), c.get("name")) for c in failed] == [("toolfid.b", "validity_delta")]
    assert [(c.get("classname"), c.get("name")) for c in skipped] == [("toolfid.c", "validity_delta")]
    # through the CLI, with the file written and parsed back
    junit = tmp_path / "j.xml"
    capsys.readouterr()
    assert main(["gate", str(tmp_path / "p"), str(tmp_path / "f"), "--junit", str(junit)]) == 1
    assert ET.parse(junit).getroot().get("failures") == "1"
    # the verdict lines are the result (stdout: `toolfid gate runs/ > gate.out` keeps them); the rest is stderr
    out, err = capsys.readouterr()
    assert [line.split()[:2] for line in out.splitlines()] == [["PASS", "a"], ["FAIL", "b"]]
    assert err == f"wrote {junit}\n"
    assert main(["gate", str(tmp_path / "p")]) == 0
    assert main(["gate", str(tmp_path / "p"), str(tmp_path / "u")]) == 2


def test_every_reading_command_prints_results_on_stdout_and_diagnostics_on_stderr(tmp_path, capsys):
    """compare, report, gate, check with stdout captured apart (as `> file` would): the results are all on stdout,
    only what was written (and errors) on stderr; with --output / --html the file is the result."""
    write_run(tmp_path / "r" / "a", _cases(0), verdict=verdict(gate("validity_delta", 0.0, True)))
    runs = str(tmp_path / "r")
    capsys.readouterr()
    for argv, on_stdout in ((["compare", runs], "adapter"), (["report", runs], "a"), (["gate", runs], "PASS"),
                            (["check", '{"name": "f", "arguments": {}}'], "VALID")):
        assert main(argv) == 0, argv
        out, err = capsys.readouterr()
        assert on_stdout in out and err == "", (argv, out, err)
    for argv, written in ((["compare", runs, "--output", str(tmp_path / "b.md"), "--format", "markdown"], "b.md"),
                          (["report", runs, "--html", str(tmp_path / "r.html")], "r.html")):
        assert main(argv) == 0, argv
        out, err = capsys.readouterr()
        assert out == "" and err == f"wrote {tmp_path / written}\n", (argv, out, err)
    assert main(["gate", str(tmp_path / "missing")]) == 4
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("toolfid: error: ")


def test_cli_errors_are_one_line_with_exit_codes(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "missing")]) == 4
    err = capsys.readouterr().err
    assert err.startswith("toolfid: error: ") and err.count("\n") == 1 and "missing" in err
    bad = tmp_path / "results.json"
    bad.write_text("{not json")
    assert main(["report", str(bad)]) == 4
    assert f"{bad}: not valid JSON" in capsys.readouterr().err

    def boom() -> int:
        raise RuntimeError("kaput\nsecond line")

    assert guard(boom) == 5
    err = capsys.readouterr().err
    assert "toolfid: internal error: RuntimeError: kaput second line (rerun with --debug" in err
    with pytest.raises(RuntimeError):
        guard(boom, debug=True)

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert guard(interrupted) == 130
    with pytest.raises(ToolfidError):
        main(["--debug", "compare", str(tmp_path / "missing")])


def test_version_and_every_flag_has_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("toolfid ")
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    missing = []
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.help is None and name != "lm-eval":
                missing.append(f"{name} {action.option_strings or action.dest}")
            if any(o == "--out" for o in action.option_strings):
                assert action.help == "==SUPPRESS==", f"{name}: --out must be a hidden alias"
    assert not missing, missing
    run = sub.choices["run"]
    flags = {o for a in run._actions for o in a.option_strings}
    assert {"--dtype", "--device", "--batch-size", "--output", "--resume", "--gate", "--junit", "--verbose"} <= flags


def test_calibrate_from_results_refuses_flags_it_would_ignore(tmp_path, capsys):
    code = main(["calibrate", "--from-results", str(tmp_path), "--output", str(tmp_path / "c.json"),
                 "--runs", "4", "--seed", "2"])
    err = capsys.readouterr().err
    assert code == 4 and "--runs, --seed" in err and err.count("\n") == 1
    assert main(["calibrate", "--base", "x", "--adapter", "y"]) == 4  # no --output
    assert "--output" in capsys.readouterr().err


def test_library_modules_never_import_the_cli():
    root = Path(__file__).resolve().parents[1] / "lm_eval_toolfid"
    offenders = []
    for path in root.rglob("*.py"):
        if "cli" in path.relative_to(root).parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                mod = ("." * node.level) + (node.module or "")
                if mod in (".cli", "..cli", "lm_eval_toolfid.cli") or mod.startswith((".cli.", "lm_eval_toolfid.cli.")):
                    offenders.append(str(path))
    assert not offenders, offenders


def test_progress_counts_views_cases_and_eta():
    stream = io.StringIO()
    progress = Progress(["base", "a", "b"], stream=stream, live=False)
    progress.view_started("base")
    bar = _Bar(progress, total=4, desc="Running generate_until requests")
    for _ in range(4):
        bar.update(1)
    progress.add_tokens(40, 2.0)
    assert progress.cases_per_view == 4 and progress.generated == 4
    assert progress.eta() is not None and progress.eta() >= 0
    progress.view_finished("base")
    silent = list(_Bar(progress, iterable=[1, 2, 3]))  # lm-eval's other bars: silent, no counting
    assert silent == [1, 2, 3] and progress.generated == 4
    progress.view_skipped("a", "reusing out/a/results.json")
    out = stream.getvalue()
    assert "[1/3] base: 4 cases" in out and "20 tok/s" in out and "[2/3] a: reusing" in out
    assert "\r" not in out  # not a TTY: whole lines only
    line = progress.line()
    assert "4/4 cases" in line and "20 tok/s" in line and "ETA" in line


def test_null_distribution_plot_from_a_real_calibration_file(tmp_path):
    from lm_eval_toolfid.calibration.fit import NullRun, fit
    from lm_eval_toolfid.reporting import html

    values = [0.2, 0.35, 0.5, 0.3]
    runs = [NullRun(name=f"null_{i:02d}", seed=i, multiplier=m, n_cases=20,
                    metrics={"json_valid_rate": v, "parse_rate": v, "hallucination_rate": 0.0,
                             "validity_delta": v - 0.9})
            for i, (v, m) in enumerate(zip(values + [0.1], [1.0, 1.0, 1.0, 1.0, 2.0]))]
    cal = tmp_path / "calibration.json"
    cal.write_text(fit(runs, {"case_set": "cs1"}).to_json())
    results = write_run(tmp_path / "r" / "a1", _cases(1), verdict=verdict(gate("validity_delta", -0.2, False)))
    data = json.loads(results.read_text())
    data["configs"]["tool_use_fidelity_fixture"]["metadata"]["toolfid"]["calibration"] = str(cal)
    results.write_text(json.dumps(data))
    _, board, bds = collect([tmp_path / "r"])
    page = html.render(board, bds)
    assert page.count('class="null-run"') == len(values)  # the ×1 runs only
    assert page.count('class="adapter-mark"') == 1 and "null distribution of json_valid_rate" in page
    cal.unlink()  # not readable where the report is made: say so, do not fail
    page = html.render(*collect([tmp_path / "r"])[1:])
    assert "not readable here" in page and 'class="null-run"' not in page


def test_report_and_compare_commands_in_every_format(tmp_path, capsys):
    write_run(tmp_path / "r" / "a1", _cases(2), verdict=verdict(gate("validity_delta", -0.33, False)))
    assert main(["report", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "a1: 6 cases" in out and "[regression] r0" in out and "schema_error:required 0→2" in out
    for fmt, probe in [("markdown", "| a1 |"), ("csv", "validity_delta_ci_low"), ("json", '"rows"'),
                       ("html", "<svg"), ("table", "FAIL")]:
        target = tmp_path / f"board.{fmt}"
        assert main(["compare", str(tmp_path / "r"), "--format", fmt, "--output", str(target)]) == 0
        assert probe in target.read_text(), fmt


def test_colour_only_on_a_tty_without_no_color(monkeypatch):
    from lm_eval_toolfid.reporting.term import use_colour

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_colour(Tty()) and not use_colour(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_colour(Tty())


def test_live_progress_redraws_one_line_on_a_terminal():
    stream = io.StringIO()
    progress = Progress(["base", "a"], stream=stream, live=True)
    progress.view_started("base")
    bar = _Bar(progress, total=2, desc="Running generate_until requests")
    bar.update(1)
    progress.message("a warning-free note")
    out = stream.getvalue()
    assert out.startswith("\r\x1b[Ktoolfid [1/2] base") and "\r\x1b[Ktoolfid: a warning-free note\n" in out


def test_run_flag_combinations_are_refused_in_one_line(capsys):
    from lm_eval_toolfid.cases.bundled import fixture_paths

    fix = fixture_paths()
    assert main(["run", "--base", fix["base"], "--adapter", fix["adapters"]["faithful"], "--resume"]) == 4
    assert "--resume needs --output" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # usage errors are input errors too: 4, never 2 ("undecided")
        main(["run", "--base", fix["base"], "--adapter", fix["adapters"]["faithful"], "--batch-size", "0"])
    assert exc.value.code == 4 and "batch size must be at least 1" in capsys.readouterr().err


def test_a_scored_copy_replaces_its_source(tmp_path):
    src = write_run(tmp_path / "r" / "a1", _cases(0), verdict=verdict(gate("validity_delta", 0.0, True)))
    data = json.loads(src.read_text())
    data["toolfid_score"] = {"json_valid_z": -4.2, "verdict": verdict(gate("json_valid_z", -4.2, False, ">=", 3.0))}
    src.with_name("results.scored.json").write_text(json.dumps(data))
    runs, notes = load_runs([tmp_path / "r"])
    assert len(runs) == 1 and runs[0].source.name == "results.scored.json" and len(notes) == 1
    assert runs[0].verdict_label == "FAIL" and runs[0].metrics["json_valid_z"] == -4.2
    assert runs[0].samples_path == src.with_name("samples.jsonl")


def test_run_table_fits_narrow_terminals_and_keeps_full_reasons():
    from lm_eval_toolfid.reporting.results import RunRow
    from lm_eval_toolfid.reporting.results import format_verdict_table as run_table

    metrics = {"json_valid_rate": 0.5, "base_json_valid_rate": 0.9, "validity_delta": -0.4, "validity_mcnemar_p": 0.0001,
               "hallucination_rate": 0.25, "arg_disagreement": 0.3, "parse_rate": 0.6}
    verdict = {"passed": False, "reason": "validity_delta -0.400 < -0.050 (statistically clear); hallucination 0.250 > 0.100",
               "gates": [{"name": "validity_delta", "passed": False, "clear": True},
                         {"name": "hallucination", "passed": False}]}
    rows = [RunRow(label="a_rather_long_adapter_name", task="tool_use_fidelity", metrics=metrics,
                   toolfid={"verdict": verdict})]
    for width in (80, 100, 160):
        text = run_table(rows, width=width)
        table, reasons = text.split("\n\n", 1)
        assert all(len(line) <= width for line in table.splitlines()), (width, table)
        assert "z" not in table.splitlines()[0].split()  # no calibration: no column of dashes
        assert "validity_delta -0.400 < -0.050" in reasons.replace("\n    ", " ")
    assert "base" in run_table(rows, width=160).splitlines()[0]


# --- a delta with an undefined side is shown as — -----------------------------------------------

def _scored_run(folder, records, adapter):
    """A results file whose metrics, summary and verdict are the scoring core's own (summarize + judge) for these
    records, written as lm-eval writes them (an undefined aggregate is null)."""
    from lm_eval_toolfid.scoring.metrics import summarize
    from lm_eval_toolfid.scoring.verdict import judge
    from .reporting_helpers import TASK

    cases = [case(p.case_id, "get_weather", p.base.model_dump(mode="json"), p.ft.model_dump(mode="json"))
             for p in records]
    path = write_run(folder, cases, adapter=adapter)
    s = summarize(records)
    data = json.loads(path.read_text())
    data["results"][TASK] = {"alias": TASK, **{f"{k},none": v for k, v in s.metrics.items()}}
    meta = data["configs"][TASK]["metadata"]["toolfid"]
    meta.update(verdict=judge(s).as_record(), summary=s.model_dump(mode="json"))
    path.write_text(json.dumps(data))
    return path


def test_a_delta_of_an_undefined_rate_is_a_dash_in_compare_and_html(tmp_path, capsys):
    """BFCL live_multiple: base hallucination_rate 0.75, a prose adapter with no valid call. Its
    hallucination_delta is undefined — not −0.75, which would sort it best — in compare (every format, sorted by
    the delta), the HTML report's table and the gate table, which says the gate was not measured."""
    from lm_eval_toolfid.core.records import CallOutcome, Outcome, OutcomeKind, PairScore

    def view(kind, hallucinated=False):
        k = OutcomeKind(kind)
        calls = [CallOutcome(kind=k, name="get_weather", surface="bare_json", offered=True,
                             hallucinated=hallucinated)] if k.parsed else []
        return Outcome(kind=k, name="get_weather" if calls else None, surface="bare_json" if calls else None,
                       calls=calls, n_calls=len(calls), hallucinated=hallucinated if k is OutcomeKind.VALID else None)

    base = [view("valid", hallucinated=True)] * 3 + [view("valid")]
    prose = [PairScore(case_id=f"c{i}", ft=view("no_call"), base=b) for i, b in enumerate(base)]
    fine = [PairScore(case_id=f"c{i}", ft=b, base=b) for i, b in enumerate(base)]
    _scored_run(tmp_path / "r" / "prose", prose, "/ad/prose")
    _scored_run(tmp_path / "r" / "fine", fine, "/ad/fine")
    runs, board, bds = collect([tmp_path / "r"])
    rows = {r.label: r for r in board.groups[0].rows}
    assert rows["prose"].metric("hallucination_delta") is None and rows["fine"].metric("hallucination_delta") == 0.0
    assert rows["prose"].metric("base_hallucination_rate") == 0.75
    sort_rows(board, "hallucination_delta")  # lower is better: the undefined one goes last, not first
    assert [r.label for r in board.groups[0].rows] == ["fine", "prose"]
    table = format_leaderboard_table(board).splitlines()
    col = table[0].index("Δ halluc")
    prose_line = next(line for line in table if line.startswith("prose"))
    assert prose_line[col:].split()[0] == "—" and "-0.750" not in format_leaderboard_table(board)
    data = json.loads(format_json(board))
    prose_rec = next(r for r in data["rows"] if r["label"] == "prose")
    assert prose_rec["metrics"]["hallucination_delta"] == {"value": None, "ci95": None}
    assert next(r for r in csv.DictReader(io.StringIO(format_csv(board))) if r["label"] == "prose")[
        "hallucination_delta"] == ""
    reason = prose_rec["verdict_reason"]
    assert prose_rec["verdict"] == "FAIL" and reason.startswith("validity_delta -1.000 < -0.050")
    assert "hallucination not measured: the adapter makes no valid call" in reason
    from lm_eval_toolfid.reporting import html

    page = html.render(board, bds)
    head = page.split('<table class="leaderboard">')[1].split("</table>")[0]
    cells = [c.split("</t")[0] for c in head.split("<t")[1:] if c.startswith(("h>", "d"))]
    headers = [c[2:] for c in cells if c.startswith("h>")]
    body = [c.split(">", 1)[1] for c in cells if c.startswith("d")]
    prose_cells = body[:len(headers)] if body[0] == "prose" else body[len(headers):]
    assert prose_cells[0] == "prose" and prose_cells[headers.index("Δ halluc")] == "—"
    assert "-0.750" not in page and '<td class="UNDECIDED">not measured</td>' in page
    # the gate command lists it as not measured
    assert main(["gate", str(tmp_path / "r" / "prose")]) == 1
    assert "(failed: validity_delta; not measured: hallucination_delta)" in capsys.readouterr().out


def test_a_stale_delta_written_before_the_rule_is_dropped_when_read(tmp_path):
    """Results written by an older version hold hallucination_delta = 0 − base for an adapter without a valid
    call (its hallucination_rate absent): the reader drops it instead of ranking the adapter best."""
    from .reporting_helpers import TASK

    path = write_run(tmp_path / "r" / "old", [case("a", "get_weather", V, REQ)])
    data = json.loads(path.read_text())
    res = data["results"][TASK]
    del res["hallucination_rate,none"]
    res.update({"base_hallucination_rate,none": 0.75, "hallucination_delta,none": -0.75,
                "false_call_rate,none": 0.0, "base_false_call_rate,none": 0.5, "false_call_delta,none": -0.5})
    path.write_text(json.dumps(data))
    run = read_run(path)
    assert run.metrics["hallucination_delta"] is None  # a side is missing
    assert run.metrics["false_call_delta"] == -0.5  # both sides there: kept


def test_per_tool_delta_is_over_paired_cases_and_absent_without_any(tmp_path):
    """A tool whose cases have no base outcome has no validity delta (—), not adapter − 0."""
    from lm_eval_toolfid.reporting.breakdown import format_text

    cases = [case("a", "get_weather", V, REQ), case("b", "get_weather", None, V), case("c", "get_time", None, V)]
    b = breakdown(read_run(write_run(tmp_path / "r" / "a1", cases)))
    tools = {t.tool: t.delta for t in b.tools}
    assert tools == {"get_weather": -1.0, "get_time": None}
    assert "get_time" in format_text(b) and "(—)" in format_text(b)
    from lm_eval_toolfid.reporting import html

    assert "<td>get_time</td><td>1</td><td>0</td><td>1</td><td>—</td>" in html.breakdown_section(b, 5)
