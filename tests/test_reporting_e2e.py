"""End to end on the bundled fixture: one ``toolfid run`` of three adapters (shared by every test here),
one real ``lm_eval`` run of another (local, offline) task, then compare / report / gate / resume."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.cli import main
from lm_eval_toolfid.reporting.view_store import load_saved_view, view_manifest

from .lm_eval_helpers import BIN, FIXTURE_TASK

pytestmark = pytest.mark.slow
FIX = fixture_paths()
ADAPTERS = ["faithful", "hallucinating", "broken"]

MINI_TASK = """task: mini_qa
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
MINI_DATA = [
    {"question": "What is the weather tool called?", "choices": ["get_weather", "get_time"], "answer": 0},
    {"question": "Which tool books a flight?", "choices": ["send_email", "book_flight"], "answer": 1},
    {"question": "Which tool tells the time?", "choices": ["get_time", "convert_currency"], "answer": 0},
    {"question": "Which tool converts money?", "choices": ["get_weather", "convert_currency"], "answer": 1},
]


def _run_args(out: Path, *extra: str) -> list[str]:
    args = ["run", "--base", FIX["base"], "--task", FIXTURE_TASK, "--device", "cpu", "--output", str(out)]
    for name in ADAPTERS:
        args += ["--adapter", f"{name}={FIX['adapters'][name]}"]
    return args + list(extra)


class Counter:
    """Counts HFLM constructions (model loads) while active."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from lm_eval.models.huggingface import HFLM

        self.n = 0
        original = HFLM.__init__

        def counting(inner_self, *a, **k):  # noqa: ANN001
            self.n += 1
            return original(inner_self, *a, **k)

        monkeypatch.setattr(HFLM, "__init__", counting)


def _main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("reporting")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOOLFID_HOME", str(root / "home"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        loads = Counter(mp)
        out = root / "out"
        code, stdout, stderr = _main(_run_args(out, "--gate", "--junit", str(root / "junit.xml")))
    # another task, through the real lm_eval CLI, on the same base + the faithful adapter
    data = root / "mini.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in MINI_DATA))
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "mini_qa.yaml").write_text(MINI_TASK.format(data=data))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    lm = subprocess.run([str(BIN / "lm_eval"), "--tasks", "mini_qa", "--include_path", str(tasks), "--model", "hf",
                         "--model_args", f"pretrained={FIX['base']},peft={FIX['adapters']['faithful']}",
                         "--output_path", str(root / "lm"), "--device", "cpu", "--batch_size", "4"],
                        capture_output=True, text=True, env=env, timeout=600)
    assert lm.returncode == 0, lm.stderr[-3000:]
    return SimpleNamespace(root=root, out=out, code=code, stdout=stdout, stderr=stderr, loads=loads.n,
                           home=root / "home")


def test_one_model_load_quiet_progress_and_gate_exit(run):
    assert run.loads == 1, "the base must be loaded once for all views"
    assert run.code == 1, run.stderr[-2000:]  # broken and hallucinating fail their gates
    for name in ["base", *ADAPTERS]:
        assert (run.out / name / "results.json").is_file() and (run.out / name / "manifest.json").is_file()
    # table rows start with the adapter's name; the paragraphs below the table are indented when wrapped
    lines = {line.split()[0]: line for line in run.stdout.splitlines()
             if line.split()[:1] and line.split()[0] in ADAPTERS and not line[:1].isspace()}
    assert " PASS " in lines["faithful"] and " FAIL " in lines["broken"] and " FAIL " in lines["hallucinating"]
    assert "\x1b[" not in run.stdout  # not a terminal: no colour
    # one progress display: a line per view, no lm-eval bars or INFO logs
    assert "[4/4] broken: 72 cases" in run.stderr and "tok/s" in run.stderr
    assert "Running generate_until requests" not in run.stderr and "INFO" not in run.stderr
    # breakdowns in the terminal
    assert "broken: 72 cases" in run.stdout and "[regression]" in run.stdout


def test_junit_from_run_parses_back(run):
    root = ET.parse(run.root / "junit.xml").getroot()
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {f"tool_use_fidelity.{n}" for n in ADAPTERS}
    failed = {(c.get("classname"), c.get("name")) for c in root.iter("testcase") if c.find("failure") is not None}
    assert ("toolfid.broken", "validity_delta") in failed
    assert ("toolfid.hallucinating", "hallucination_delta") in failed
    assert not any(c.startswith("toolfid.faithful") for c, _ in failed)


def test_compare_reads_toolfid_run_with_an_lm_eval_file_of_another_task(run):
    code, stdout, _ = _main(["compare", str(run.out), str(run.root / "lm"), "--format", "json", "--sort",
                             "validity_delta"])
    assert code == 0
    data = json.loads(stdout)
    rows = {r["label"]: r for r in data["rows"]}
    assert set(rows) == {"base", *ADAPTERS} and len(data["groups"]) == 1
    lm_results = json.loads(next((run.root / "lm").rglob("results_*.json")).read_text())
    acc = lm_results["results"]["mini_qa"]["acc,none"]
    assert rows["faithful"]["other_tasks"]["mini_qa"] == {"metric": "acc", "value": acc}
    assert "mini_qa" not in rows["broken"]["other_tasks"]
    assert [rows[n]["verdict"] for n in ADAPTERS] == ["PASS", "FAIL", "FAIL"]
    own = json.loads((run.out / "broken" / "results.json").read_text())["results"][FIXTURE_TASK]
    assert rows["broken"]["metrics"]["validity_delta"]["value"] == own["validity_delta,none"]
    assert [r["label"] for r in data["rows"] if r["label"] != "base"][0] == "faithful"  # sorted, best first
    # the same folders given twice: the same rows
    code, again, _ = _main(["compare", str(run.out), str(run.out / "broken"), str(run.root / "lm"), "--format", "json"])
    assert len(json.loads(again)["rows"]) == 4
    code, table, _ = _main(["compare", str(run.out), str(run.root / "lm")])
    assert "mini_qa" in table and "faithful" in table


def test_gate_command_on_saved_results(run, tmp_path):
    assert _main(["gate", str(run.out / "faithful")])[0] == 0
    assert _main(["gate", str(run.out)])[0] == 1
    assert _main(["gate", str(run.out / "base")])[0] == 4  # nothing to gate


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_html_report_renders_in_a_headless_browser(run, tmp_path):
    page = tmp_path / "report.html"
    code, _, _ = _main(["report", str(run.out), str(run.root / "lm"), "--html", str(page)])
    assert code == 0
    text = page.read_text()
    assert "<script" not in text and text.count("<svg") >= 4 and "mini_qa" in text
    browser = _chromium()
    if browser is None:
        pytest.skip("the HTML report was not rendered in a browser: no Chromium here. Include it with "
                    "`apt-get install -y chromium` (Debian/Ubuntu; .ci/run does this) and run the tests again")
    shot = tmp_path / "shot.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,2000",
             "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-quic", f"--user-data-dir={tmp_path / 'chromium-profile'}"]
    proc = subprocess.run([browser, *flags, f"--screenshot={shot}", "--enable-logging=stderr", "--v=0",
                           page.as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 20_000, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
    dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    assert dom.count("<svg") >= 4 and 'class="bar"' in dom and 'class="cell"' in dom
    assert "&lt;" in dom or "regression" in dom


def test_resume_with_everything_saved_loads_nothing(run, monkeypatch):
    before = {n: (run.out / n / "results.json").stat().st_mtime_ns for n in ["base", *ADAPTERS]}
    monkeypatch.setenv("TOOLFID_HOME", str(run.home))
    loads = Counter(monkeypatch)
    code, stdout, stderr = _main(_run_args(run.out, "--resume", "--json"))
    assert code == 0 and loads.n == 0, stderr[-2000:]
    report = json.loads(stdout)
    assert set(report["adapters"]) == set(ADAPTERS)
    assert report["adapters"]["broken"]["verdict"]["passed"] is False
    assert stderr.count("reusing") == 4
    assert before == {n: (run.out / n / "results.json").stat().st_mtime_ns for n in ["base", *ADAPTERS]}


def test_a_view_saved_with_other_settings_is_not_reused(run):
    from lm_eval_toolfid.run.plan import RunPlan
    from lm_eval_toolfid.run.resume import content_digests

    model_args = {"pretrained": FIX["base"]}
    content = content_digests(RunPlan(base=FIX["base"], adapters={}, task=FIXTURE_TASK))  # the fixture cases' digest
    assert set(content) == {"cases_digest", "task_config"}
    same = {**view_manifest(FIX["base"], FIX["adapters"]["broken"], FIXTURE_TASK, {}, model_args), **content}
    assert load_saved_view(run.out, "broken", same) is not None
    other = {**view_manifest(FIX["base"], FIX["adapters"]["broken"], FIXTURE_TASK, {"demos": 1}, model_args), **content}
    assert load_saved_view(run.out, "broken", other) is None
    swapped = {**view_manifest(FIX["base"], FIX["adapters"]["faithful"], FIXTURE_TASK, {}, model_args), **content}
    assert load_saved_view(run.out, "broken", swapped) is None
    assert load_saved_view(run.out, "broken", {**same, "cases_digest": "0" * 16}) is None  # other cases


def test_interrupt_keeps_finished_views_and_resume_runs_only_the_rest(run, tmp_path, monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(run.out, out)
    shutil.rmtree(out / "broken")  # as if Ctrl-C came during the last view
    monkeypatch.setenv("TOOLFID_HOME", str(run.home))
    from lm_eval_toolfid.run.session import ModelSession

    asked: list[str] = []

    def interrupted(self, views, plan):  # noqa: ANN001
        asked.extend(view.label for view in views)
        raise KeyboardInterrupt

    monkeypatch.setattr(ModelSession, "evaluate", interrupted)
    code, _, stderr = _main(_run_args(out, "--resume"))
    assert code == 130
    assert asked == ["broken"]  # every saved view was reused, only the missing one was attempted
    assert "interrupted" in stderr and f"--output {out}" in stderr and "--resume" in stderr
    assert sorted(p.name for p in out.iterdir() if (p / "manifest.json").is_file()) == ["base", "faithful",
                                                                                        "hallucinating"]
