"""What `toolfid demo` / `toolfid run` print: one progress line per view, the task's warnings as notes under
their view, no lm-eval log line unless --verbose, and a verdict table that fits the terminal with the full
reasons below it."""

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
    table = proc.stdout.split("\nadapter ", 1)[1].split("\nresults and per-case samples")[0]
    assert all(len(line) <= 100 for line in table.splitlines()), max(table.splitlines(), key=len)
    rows = {line.split()[0]: line for line in table.splitlines()  # table rows (wrapped notes below are indented)
            if line[:1].strip() and line.split()[0] in ("faithful", "hallucinating", "broken")}
    assert " PASS " in rows["faithful"] and " FAIL " in rows["hallucinating"] and " FAIL " in rows["broken"]
    # the full reasons follow the table, one paragraph per adapter
    reasons = proc.stdout.replace("\n    ", " ")
    assert "hallucinating: FAIL — validity_delta " in reasons and "hallucination_delta +1.000 > +0.100" in reasons


@pytest.mark.slow
def test_verbose_brings_lm_eval_logs_back(tmp_path):
    proc = _demo(tmp_path, "--verbose")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tool_use_fidelity verdict: FAIL" in proc.stderr


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
