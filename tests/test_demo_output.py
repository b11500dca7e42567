"""What `toolfid demo` / `toolfid run` print: one progress line per view (a group decoded together said so), the
task's warnings as notes under their view, no lm-eval log line unless --verbose; then the verdict first: one header
line, a table that fits the terminal, a legend, the full reasons (a shared note once), where the results are; the
engine's account under --verbose."""

from __future__ import annotations

import io
import logging
import os
import subprocess

import pytest

from lm_eval_toolfid.reporting.progress import Progress, quiet_lm_eval

from .lm_eval_helpers import BIN


def _demo(tmp_path, *extra, columns=100):
    env = dict(os.environ, TOOLFID_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1", COLUMNS=str(columns),
               OMP_NUM_THREADS="1")
    return subprocess.run([str(BIN / "toolfid"), "demo", "--no-breakdown", "--output", str(tmp_path / "out"),
                           *extra], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_demo_output_is_quiet_ordered_and_fits_the_terminal(tmp_path):
    proc = _demo(tmp_path, columns=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    both = proc.stdout + proc.stderr
    assert "WARNING" not in both and "INFO" not in both, both
    progress = [line for line in proc.stderr.splitlines() if line.startswith("toolfid: [")]
    views = len(progress)
    assert views >= 4 and [line.split("]")[0] for line in progress] == [f"toolfid: [{i}/{views}"
                                                                       for i in range(1, views + 1)]
    # the verdict first: at most two lines before the table (the header, and why prompt_style auto chose)
    before, table = proc.stdout.split("\nadapter ", 1)
    assert 1 <= len([line for line in before.splitlines() if line.strip()]) <= 2, before
    assert before.strip().startswith("tool_use_fidelity_fixture — base ") and " 72 cases, prompt " in before
    table = table.split("\nresults and per-case samples")[0]
    assert all(len(line) <= 100 for line in table.splitlines()), max(table.splitlines(), key=len)
    rows = {line.split()[0]: line for line in table.splitlines()  # table rows (wrapped notes below are indented)
            if line[:1].strip() and line.split()[0] in ("faithful", "hallucinating", "broken")}
    assert " PASS " in rows["faithful"] and " FAIL " in rows["hallucinating"] and " FAIL " in rows["broken"]
    # a legend under the table: what is gated, what halluc and arg-diff are
    legend = " ".join(table.split("\ngated: ", 1)[1].split("\n\n", 1)[0].split())
    assert legend.startswith("delta (valid − base ≥ -0.05) and the change in halluc from the base's (≤ +0.10)")
    assert "not gated: p(McNemar), halluc itself, arg-diff, parse" in legend and "arg-diff: share of" in legend
    # the full reasons follow, one paragraph per adapter; the note they all share is said once
    reasons = proc.stdout.replace("\n    ", " ")
    assert "hallucinating: FAIL — validity_delta " in reasons and "hallucination_delta +1.000 > +0.100" in reasons
    assert reasons.count("no null calibration: z not computed") == 1
    assert "(every adapter: no null calibration: z not computed)" in reasons
    # the engine's account is left to --verbose (and the run's records); a near-tie line only as a warning
    for internal in ("verified against", "drafting", "decoded together", "tokens accepted", "near ties ("):
        assert internal not in proc.stdout, internal
    assert "results and per-case samples: " in proc.stdout


@pytest.mark.slow
def test_verbose_brings_lm_eval_logs_back(tmp_path):
    # the first 8 fixture cases: what --verbose brings back (lm-eval's log lines, the task's verdict line, the
    # engine's account) does not depend on how many cases there are; every adapter still gets its verdict
    # (the hallucinating and broken adapters FAIL on each of them). The whole demo is the test above.
    proc = _demo(tmp_path, "--verbose", "--limit", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tool_use_fidelity verdict: FAIL" in proc.stderr
    # what the run is about to do, and (--verbose) how long the rest should take at the first view's pace
    assert "toolfid: 8 cases × 5 views to run (base, faithful, hallucinating, broken, prose_after_results)" \
        in proc.stderr.splitlines()
    assert proc.stderr.count("toolfid: estimate: 4 more views × 8 cases ≈ ") == 1
    # and the engine's account of how the views' tokens were obtained, above the table
    above = " ".join(proc.stdout.split("\nadapter ", 1)[0].split())
    assert "tokens of faithful" in above and "verified against the base's answers" in above


def test_task_warnings_become_notes_under_their_view_and_the_verdict_line_is_left_to_the_table():
    stream = io.StringIO()
    progress = Progress(["base", "a"], stream=stream, live=False)
    log = logging.getLogger("lm_eval.toolfid")
    progress.view_started("a")
    with quiet_lm_eval(progress):
        log.warning("tool_use_fidelity: the chat template of X ignores tools=; the tool specs go in a system message")
        log.warning("tool_use_fidelity verdict: PASS — all gates hold")
        logging.getLogger("lm_eval.evaluator").warning("an lm-eval warning")
    progress.view_finished("a", 3)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("toolfid: [1/2] a: 3 cases")
    assert lines[1] == "toolfid:   note: the chat template of X ignores tools=; the tool specs go in a system message"
    assert len(lines) == 2


def test_a_run_of_many_views_mutes_lm_eval_once_and_puts_every_level_back(monkeypatch):
    """Each view's quiet context found lm-eval's loggers already muted for the run: no ``setLevel`` per view (each
    one clears every logger's cache: a thousand over a hundred views). After the run every level is as it was."""
    from lm_eval_toolfid.reporting.progress import muted_logs

    names = ("lm_eval", "transformers", "peft", "datasets", "lm_eval.toolfid")
    before = {n: logging.getLogger(n).level for n in names}
    calls = []
    real = logging.Logger.setLevel
    monkeypatch.setattr(logging.Logger, "setLevel", lambda self, level: (calls.append(self.name), real(self, level)))
    progress = Progress([f"v{k}" for k in range(10)], stream=io.StringIO(), live=False)
    with muted_logs():
        muting = len(calls)
        for k in range(10):
            progress.view_started(f"v{k}")
            with quiet_lm_eval(progress):
                assert logging.getLogger("lm_eval.evaluator").getEffectiveLevel() == logging.ERROR
                assert not logging.getLogger("lm_eval").isEnabledFor(logging.WARNING)
            progress.view_finished(f"v{k}", 1)
    assert muting == 4 and calls.count("lm_eval") == 2 and calls.count("transformers") == 2
    assert len(calls) <= 8 + 2 * 10  # toolfid's own logger: set and put back per view, unless already at WARNING
    assert {n: logging.getLogger(n).level for n in names} == before
    with muted_logs(verbose=True):  # --verbose: lm-eval's logs as they are
        assert logging.getLogger("lm_eval").level == before["lm_eval"]


# --- the screen, from the scoring core's own verdicts (no model) -----------------------------------------------

def _row(label, ft_texts, base_texts, generation=None):
    """A verdict table row whose metrics, verdict and notes are the scoring core's own (summarize + judge)."""
    import json as _json

    from lm_eval_toolfid.reporting.results import RunRow
    from lm_eval_toolfid.scoring.compare import pair
    from lm_eval_toolfid.scoring.metrics import summarize
    from lm_eval_toolfid.scoring.outcome import score_generation
    from lm_eval_toolfid.scoring.verdict import judge

    from .conftest import make_case

    case, pairs = make_case(), []
    for i, (ft, base) in enumerate(zip(ft_texts, base_texts)):
        c = case.model_copy(update={"id": f"c{i}"})
        pairs.append(pair(c, score_generation(ft, c), score_generation(base, c), ft, base))
    s = summarize(pairs)
    toolfid = {"verdict": judge(s).as_record(), "n_cases": len(pairs), "prompt_style": "plain",
               "prompt_template": "plain-v1", "prompt_style_requested": "plain", **({"generation": generation}
                                                                                      if generation else {})}
    del _json
    return RunRow(label=label, task="tool_use_fidelity", metrics=dict(s.metrics), toolfid=toolfid)


def _call(name="get_weather", city="Paris"):
    import json as _json

    return _json.dumps({"name": name, "arguments": {"city": city}})


def _rows():
    base = [_call()] * 40
    return [_row("faithful", base, base),
            _row("renamer", [_call("get_forecast")] * 40, base),
            _row("borderline", ["prose"] * 3 + [_call()] * 37, base)]


def test_the_screen_puts_the_verdict_first_explains_its_columns_and_says_a_shared_note_once():
    from lm_eval_toolfid.reporting import screen

    rows = _rows()
    head = screen.header("tool_use_fidelity", "my/base", rows[0])
    assert len(head) == 1 and head[0].startswith("tool_use_fidelity — base my/base: 40 cases, prompt plain plain-v1")
    text = screen.verdicts(rows, width=120)
    table, legend_and_reasons = text.split("\n", 5)[:5], text.split("\n", 5)[5]
    assert table[0].split()[0] == "adapter" and [line.split()[0] for line in table[2:]] == [r.label for r in rows]
    flat = " ".join(legend_and_reasons.split())
    # the legend: what is gated (delta; halluc only through its change from the base), what is not, the words
    assert flat.startswith("gated: delta (valid − base ≥ -0.05) and the change in halluc from the base's (≤ +0.10); "
                           "not gated: p(McNemar), halluc itself, arg-diff, parse. halluc: share of valid answers that "
                           "call a tool not offered; arg-diff: share of argument values that differ from the base's")
    assert "(borderline) only the estimate is — a FAIL either way" in flat
    # one line per adapter (wrapped lines indented), the note every adapter shares said once, after them
    reasons = [line for line in text.split("\n\n", 1)[1].splitlines() if not line.startswith("    ")]
    assert [line.split(":")[0] for line in reasons] == ["faithful", "renamer", "borderline",
                                                        "(every adapter"]
    assert text.count("no null calibration: z not computed") == 1
    assert reasons[-1] == "(every adapter: no null calibration: z not computed)"
    # verdicts unchanged: the renamer FAILs clearly on hallucination, the borderline adapter FAILs (not "noise")
    rows_by = {line.split()[0]: line for line in table[2:]}
    assert " PASS " in rows_by["faithful"] and " FAIL " in rows_by["renamer"] and "halluc (clear)" in rows_by["renamer"]
    assert " FAIL " in rows_by["borderline"] and "validity (borderline)" in rows_by["borderline"]
    assert "noise" not in text
    assert "borderline: FAIL — validity_delta -0.075 < -0.050 (not statistically clear" in flat.replace("\n", " ")


def test_a_note_only_some_adapters_have_stays_on_their_line():
    from lm_eval_toolfid.reporting import screen

    rows = _rows()
    rows[1].toolfid["verdict"]["notes"] = ["only mine", *rows[1].toolfid["verdict"]["notes"]]
    lines = {line.split(":")[0]: line for line in screen.reasons(rows, width=1000).splitlines()}
    assert "; only mine" in lines["renamer"] or "(only mine" in lines["renamer"]
    assert "only mine" not in lines["faithful"] + lines["borderline"] + lines["(every adapter"]


def test_near_ties_are_one_warning_line_only_when_they_could_change_a_verdict():
    from lm_eval_toolfid.reporting import screen

    base = [_call()] * 40
    close = _row("close", ["prose"] * 2 + [_call()] * 38, base,  # delta -0.05: one case from the floor
                 generation={"near_tie_cases": 1, "near_tie_tokens": 1, "joint_near_tie_cases": 1})
    far = _row("far", base, base, generation={"prefix_near_tie_cases": 1})  # +0.000: 2 cases from the floor
    assert screen.near_tie_warning([far]) == ""
    warning = screen.near_tie_warning([close, far], width=1000)
    assert "\n" not in warning and warning.startswith("warning: near ties could change the verdict of close (2 ")
    assert "far" not in warning and "--no-verify / --views-together 1" in warning and "--verbose" in warning
    # a FAIL changes only if every failed gate turns: one far past its threshold keeps it, whatever the ties
    renamer = _row("renamer", ["prose"] * 3 + [_call("get_forecast")] * 37, base,
                   generation={"near_tie_cases": 3})  # validity 3 cases past, hallucination 37 cases past
    assert renamer.toolfid["verdict"]["passed"] is False and screen.near_tie_warning([renamer]) == ""
    assert "renamer" in screen.near_tie_warning([renamer], _row("base", base, base,
                                                                 generation={"prefix_near_tie_cases": 40}))


def test_the_run_says_what_it_is_about_to_run_and_under_verbose_an_estimate():
    stream = io.StringIO()
    progress = Progress(["base", "a", "b"], stream=stream, live=False)
    progress.estimate = True
    progress.view_started("base")
    progress.requests(40)
    progress.requests(40)  # a second pass over the same cases: said once
    progress.view_finished("base", 40)
    progress.view_started("a")
    progress.view_finished("a", 40)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "toolfid: 40 cases × 3 views to run (base, a, b)"
    assert lines[1].startswith("toolfid: [1/3] base: 40 cases in ")
    assert lines[2].startswith("toolfid: estimate: 2 more views × 40 cases ≈ ") and len(lines) == 4  # once
    # what it rests on: the finished view's time per case, times the cases still to run
    assert progress.estimate_line(20.0, 40).startswith(
        "estimate: 2 more views × 40 cases ≈ 0:40 at this view's 0.5 s per case (a rough guide")
    resumed = Progress(["base", "a"], stream=io.StringIO(), live=False)
    resumed.view_skipped("base", "reused")
    resumed.requests(7)
    assert resumed.plan_line() == "7 cases × 1 view to run (base, a; 1 reused)"
    assert resumed.estimate_line(3.0, 7) is None  # nothing left after the one view that runs


def test_progress_of_views_decoded_together_says_so_and_charges_no_time_twice():
    stream = io.StringIO()
    progress = Progress(["base", "a", "b"], stream=stream, live=False)
    progress.together = [["a", "b"]]
    for label in ("base", "a", "b"):
        progress.view_started(label)
        progress.view_finished(label, 5)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("toolfid: [1/3] base: 5 cases in ")
    assert lines[1].startswith("toolfid: [2/3] a + b, decoded together: 2 × 5 cases in ")
    assert lines[2] == "toolfid: [3/3] b: 5 cases (decoded above, together with a)"


def test_the_live_line_of_a_group_counts_its_rows_once():
    stream = io.StringIO()
    progress = Progress(["base", "a", "b"], stream=stream, live=False)
    progress.cases_per_view = 5
    progress.together = [["a", "b"]]
    progress.view_started("a")
    progress.requests(5)
    for _ in range(10):  # the engine finishes the rows of both views
        progress.engine_row(3, 0.1)
    progress.advance(5)  # lm-eval's bar counts a's five
    assert "a + b · 10/10 cases" in progress.line() and progress.generated == 10
    progress.view_finished("a", 5)
    progress.view_started("b")
    progress.requests(5)
    progress.advance(5)  # b's answers were computed with a's: no new rows
    assert progress.generated == 10 and "[2/3] b · 5/5 cases" in progress.line()
