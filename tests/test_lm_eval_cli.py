"""End to end through the real ``lm_eval`` CLI on the bundled tiny model and its four adapters.

The user's two-run flow: a base run stores its reference; each adapter run pairs with it
automatically and reports paired metrics and the verdict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.core.records import PairScore

from .lm_eval_helpers import (BIN, FIXTURE_TASK, lm_eval_cli, lm_eval_here, metrics, read_run, toolfid_here,
                              toolfid_meta)

pytestmark = pytest.mark.slow
FIX = fixture_paths()
PAIRED = {"json_valid_rate", "parse_rate", "base_json_valid_rate", "validity_delta", "fidelity_pass",
          "validity_mcnemar_p", "base_hallucination_rate", "identical_output_rate",
          "gold_tool_rate", "base_gold_tool_rate"}
# defined only when some case is in their denominator (e.g. arg_disagreement needs a case valid in both views,
# hallucination_delta a valid call in each view)
WHEN_DEFINED = {"hallucination_rate", "name_hallucination_rate", "arg_disagreement", "hallucination_delta"}


@pytest.fixture(scope="module")
def two_run_flow(tmp_path_factory):
    """Base run, then each adapter run, sharing one reference store: the base through the ``lm_eval`` console
    script in its own process (the two-run flow as a user runs it: the reference it writes crosses processes),
    the adapters through lm-eval's same entry point in this process (what they check is the pairing and the
    verdict, not the console script: an adapter run through the console script pairing with a stored reference is
    tests/test_identity_flows.py's README flow; a second console run here paid lm-eval's imports and task index
    again, about 15 s)."""
    root = tmp_path_factory.mktemp("cli")
    home = root / "home"
    runs = {}
    for i, (name, model_args) in enumerate([("base", f"pretrained={FIX['base']}")] + [
            (n, f"pretrained={FIX['base']},peft={p}") for n, p in FIX["adapters"].items()]):
        proc = (lm_eval_cli if i == 0 else lm_eval_here)(model_args, root / name, home)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = (*read_run(root / name), proc.stderr)
    return root, runs


def test_base_run_reports_unpaired_metrics_and_stores_a_reference(two_run_flow):
    _, runs = two_run_flow
    results, samples, _ = runs["base"]
    m = metrics(results)
    assert {"json_valid_rate", "parse_rate", "hallucination_rate", "name_hallucination_rate", "gold_tool_rate"} <= set(m)
    # nothing to pair in a base run: the adapter columns are there, and null
    assert all(m[k] is None for k in ("validity_delta", "fidelity_pass", "base_json_valid_rate", "fidelity_decided"))
    assert m["cases_scored"] == results["n-samples"][FIXTURE_TASK]["effective"]
    assert m["json_valid_rate"] >= 0.9  # the fixture model really calls tools
    assert len(samples) == results["n-samples"][FIXTURE_TASK]["effective"] >= 40
    assert os.path.isfile(toolfid_meta(results)["reference_written"])


def test_adapter_runs_pair_automatically_and_report_every_metric(two_run_flow):
    _, runs = two_run_flow
    for name in FIX["adapters"]:
        results, samples, stderr = runs[name]
        assert PAIRED <= set(metrics(results)), name
        defined = {k for k, v in metrics(results).items() if v is not None}
        assert (WHEN_DEFINED <= defined) == (name != "broken"), name  # broken makes no valid call
        assert toolfid_meta(results)["pairing"].startswith("reference store"), name
        assert f"paired with base reference {toolfid_meta(runs['base'][0])['reference_written']}" in stderr
        assert "tool_use_fidelity verdict:" in stderr
        base_rate = metrics(runs["base"][0])["json_valid_rate"]
        assert metrics(results)["base_json_valid_rate"] == pytest.approx(base_rate)
        # the per-case record in the samples explains each case
        record = PairScore.model_validate(samples[0]["fidelity_pass"])
        assert record.base is not None and record.case_id == samples[0]["doc"]["id"]


def test_verdicts_of_the_adapters(two_run_flow):
    _, runs = two_run_flow
    faithful, halluc, broken = (metrics(runs[n][0]) for n in ("faithful", "hallucinating", "broken"))
    prose_after = toolfid_meta(runs["prose_after_results"][0])["verdict"]
    assert prose_after["label"] == "FAIL" and "multi-turn cases alone" in prose_after["reason"]
    assert faithful["fidelity_pass"] == 1.0
    assert halluc["fidelity_pass"] == 0.0 and halluc["hallucination_rate"] >= 0.5
    assert broken["fidelity_pass"] == 0.0 and broken["validity_delta"] <= -0.5
    gates = {g["name"]: g["passed"] for g in toolfid_meta(runs["broken"][0])["verdict"]["gates"]}
    assert gates["validity_delta"] is False
    gates = {g["name"]: g["passed"] for g in toolfid_meta(runs["hallucinating"][0])["verdict"]["gates"]}
    assert gates["hallucination_delta"] is False
    assert halluc["name_hallucination_rate"] >= halluc["hallucination_rate"] * 0.5
    # paired stderr of the delta comes from lm-eval's own mean_stderr over per-case deltas
    stderr = runs["broken"][0]["results"][FIXTURE_TASK]["validity_delta_stderr,none"]
    assert isinstance(stderr, float) and stderr > 0


def test_an_adapter_with_no_valid_call_has_no_hallucination_delta(two_run_flow, tmp_path, capsys):
    """The fixture's broken adapter makes no valid call: its hallucination_rate is undefined, so its
    hallucination_delta is too — null in lm-eval's results.json (never 0 − base), — in `toolfid compare` and
    the HTML report, and the verdict FAILs on validity, saying the hallucination gate was not measured."""
    from lm_eval_toolfid.cli import main

    root, runs = two_run_flow
    results = runs["broken"][0]
    raw = results["results"][FIXTURE_TASK]
    assert raw.get("hallucination_delta,none") is None and "hallucination_rate,none" not in raw
    assert isinstance(raw["base_hallucination_rate,none"], float)
    verdict = toolfid_meta(results)["verdict"]
    assert verdict["label"] == "FAIL" and verdict["reason"].startswith("validity_delta -")
    assert "hallucination not measured: the adapter makes no valid call" in verdict["reason"]
    gate = {g["name"]: g for g in verdict["gates"]}["hallucination_delta"]
    assert gate["measured"] is False and gate["passed"] is None and gate["value"] is None
    assert toolfid_meta(results)["summary"]["metrics"]["hallucination_delta"] is None
    # compare: the value is absent in JSON, a dash in the table even beside an adapter that has one
    out = tmp_path / "board.json"
    assert main(["compare", str(root / "broken"), str(root / "faithful"), "--format", "json",
                 "--output", str(out), "--sort", "hallucination_delta"]) == 0
    rows = {r["label"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["broken"]["metrics"]["hallucination_delta"]["value"] is None
    assert isinstance(rows["faithful"]["metrics"]["hallucination_delta"]["value"], float)
    assert main(["compare", str(root / "broken"), str(root / "faithful"), "--sort", "hallucination_delta"]) == 0
    table = capsys.readouterr().out.splitlines()
    col = table[0].index("Δ halluc")
    assert [line.split()[0] for line in table[2:4]] == ["faithful", "broken"]  # the undefined one last
    assert table[3][col:].split()[0] == "—"
    page = tmp_path / "report.html"
    assert main(["report", str(root / "broken"), str(root / "faithful"), "--html", str(page)]) == 0
    html = page.read_text()
    board = html.split('<table class="leaderboard">')[1].split("</table>")[0]
    heads = [h.split("</th>")[0] for h in board.split("<th>")[1:]]
    broken_row = next(r for r in board.split("<tr")[1:] if "<td>broken</td>" in r)
    cells = [c.split("</td>")[0].split(">")[-1] for c in broken_row.split("<td")[1:]]
    assert cells[heads.index("Δ halluc")] == "—"
    assert "not measured" in html


def test_toolfid_run_matches_the_two_run_flow_case_by_case(two_run_flow, tmp_path):
    _, runs = two_run_flow
    out = tmp_path / "demo"
    proc = toolfid_here(["demo", "--output", out], tmp_path / "home",  # toolfid's entry point, in this process
                        env={"COLUMNS": "120"})  # the width the README's blocks were printed at
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout
    _printed_examples_are_what_the_demo_prints(proc, out, tmp_path)
    assert "faithful" in table and "PASS" in table and "FAIL" in table
    for name in FIX["adapters"]:
        cli_cases = {s["doc"]["id"]: PairScore.model_validate(s["fidelity_pass"]) for s in runs[name][1]}
        inproc = [json.loads(line) for line in (out / name / "samples.jsonl").read_text().splitlines()]
        in_cases = {s["doc"]["id"]: PairScore.model_validate(s["fidelity_pass"]) for s in inproc}
        assert in_cases == cli_cases, name
        # toolfid run stops each row at the end of its call (ToolfidHFLM): its raw generations are
        # prefixes of the CLI run's, which generated to until/max_gen_toks
        cli_raw = {s["doc"]["id"]: s["resps"][0][0] for s in runs[name][1]}
        in_raw = {s["doc"]["id"]: s["resps"][0][0] for s in inproc}
        assert all(cli_raw[cid].startswith(text) for cid, text in in_raw.items()), name
        # one samples shape for every reader: toolfid run writes what lm_eval --log_samples writes
        cli_sample, in_sample = runs[name][1][0], next(s for s in inproc if s["doc_id"] == runs[name][1][0]["doc_id"])
        assert set(in_sample) == set(cli_sample), name
        assert in_sample["arguments"] == cli_sample["arguments"]
        assert list(in_sample["arguments"]) == ["gen_args_0"] and set(in_sample["arguments"]["gen_args_0"]) == {
            "arg_0", "arg_1"}
        assert isinstance(in_sample["target"], str)
    for line in table.splitlines():
        if line.startswith("faithful"):
            assert " PASS " in line
        if line.startswith(("hallucinating", "broken", "prose_after_results")):
            assert " FAIL " in line


def _printed_examples_are_what_the_demo_prints(demo, out, tmp_path):
    """Every block of README.md and docs/*.md marked as printed by ``toolfid demo`` (or by ``toolfid gate`` on its
    output) is what this demo run printed, line by line (tests/doc_output.py: ``…`` marks lines left out): a
    wording change cannot leave a printed example behind. This run's plan line says what it is about to run."""
    from .doc_output import all_printed_blocks, mismatches

    assert "toolfid: 72 cases × 5 views to run (base, faithful, hallucinating, broken, prose_after_results)" \
        in demo.stderr.splitlines()
    gate = toolfid_here(["gate", out], tmp_path / "home")
    assert gate.returncode == 1 and gate.stderr == ""  # the verdict lines are results: stdout
    printed = {"toolfid demo": demo.stdout, "toolfid gate on the demo's output": gate.stdout}
    blocks = [b for b in all_printed_blocks() if b.source in printed]
    assert {b.file for b in blocks} >= {"README.md", "docs/metrics.md", "docs/reporting.md"}
    problems = [p for b in blocks for p in mismatches(b, printed[b.source])]
    assert not problems, "printed examples that are not what the tool prints:\n" + "\n".join(problems)


def test_base_samples_override_pairs_without_the_store(two_run_flow, tmp_path):
    root, runs = two_run_flow
    base_samples = sorted((root / "base").rglob(f"samples_{FIXTURE_TASK}_*.jsonl"))[-1]
    proc = lm_eval_here(f"pretrained={FIX['base']},peft={FIX['adapters']['broken']}", tmp_path / "o",
                       tmp_path / "empty-home", metadata={"base_samples": str(base_samples)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, _ = read_run(tmp_path / "o")
    assert toolfid_meta(results)["pairing"].startswith("base_samples")
    assert metrics(results)["validity_delta"] == pytest.approx(metrics(runs["broken"][0])["validity_delta"])


def test_no_reference_means_adapter_metrics_and_one_warning(tmp_path):
    # 4 cases: an empty store has no reference of any case set, so the fewest cases show the unpaired run
    proc = lm_eval_here(f"pretrained={FIX['base']},peft={FIX['adapters']['faithful']}", tmp_path / "o",
                       tmp_path / "empty-home", metadata={"demos": 1}, extra=["--limit", "4"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, _ = read_run(tmp_path / "o")
    m = metrics(results)
    assert "json_valid_rate" in m and m["validity_delta"] is None and m["fidelity_pass"] is None
    assert m["fidelity_decided"] == 0.0
    assert toolfid_meta(results)["verdict"]["label"] == "UNDECIDED"
    assert proc.stderr.count("no base reference") == 1


def test_a_stale_reference_is_never_used(two_run_flow, tmp_path):
    """Same store, but the adapter run asks for other prompt settings: the base reference does not match.

    8 cases: an adapter run of a subset pairs with the full reference when its settings match (the delta-weights
    test below pairs on ``--limit 8``), so only the stale settings can keep this one unpaired."""
    root, _ = two_run_flow
    proc = lm_eval_here(f"pretrained={FIX['base']},peft={FIX['adapters']['faithful']}", tmp_path / "o",
                       root / "home", metadata={"demos": 1}, extra=["--limit", "8"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, _ = read_run(tmp_path / "o")
    assert metrics(results)["validity_delta"] is None  # unpaired: the column is there, null


def test_bad_input_is_one_line(tmp_path, capsys):
    from lm_eval_toolfid.cli import main

    bad_cases = tmp_path / "bad.jsonl"
    bad_cases.write_text('{"id": "x", "prompt": "p"}\n')
    proc = lm_eval_cli(f"pretrained={FIX['base']}", tmp_path / "o", tmp_path / "h",
                       metadata={"cases": str(bad_cases)})
    assert proc.returncode != 0
    assert f"{bad_cases}:1:" in proc.stderr and "Traceback" not in proc.stderr
    # toolfid's pass-through checks the adapter directory before lm-eval loads anything
    broken_dir = tmp_path / "not-an-adapter"
    broken_dir.mkdir()
    # (these two in this process: both stop before any model loads; the console script is run elsewhere)
    capsys.readouterr()
    code = main(["lm-eval", "--tasks", FIXTURE_TASK, "--model", "hf", "--model_args",
                 f"pretrained={FIX['base']},peft={broken_dir}"])
    err = capsys.readouterr().err
    assert code == 4 and "no adapter_config.json" in err and "Traceback" not in err
    code = main(["run", "--base", str(tmp_path / "nope"), "--adapter", FIX["adapters"]["faithful"]])
    err = capsys.readouterr().err
    assert code == 4 and "Traceback" not in err, err


def test_installed_entry_points(tmp_path):
    proc = subprocess.run([str(BIN / "toolfid"), "fixtures"], capture_output=True, text=True, check=True)
    paths = json.loads(proc.stdout)
    assert set(paths["adapters"]) == {"faithful", "hallucinating", "broken", "prose_after_results"}
    assert os.path.isdir(paths["base"]) and os.path.isfile(paths["cases"])
    tasks = subprocess.run([str(BIN / "toolfid"), "tasks-path"], capture_output=True, text=True, check=True)
    assert os.path.isfile(os.path.join(tasks.stdout.strip(), "tool_use_fidelity", "tool_use_fidelity.yaml"))
    assert sys.executable  # the same interpreter runs both


# --- pairing cannot be fooled (each through lm-eval's own entry point, in this process; bad input through the
# console script: the one-line error is what the console prints) ---

def _copy_home(root, tmp_path):
    import shutil

    home = tmp_path / "home"
    shutil.copytree(root / "home", home)
    return home


def _full_reference(home):
    refs = [p for p in (home / "references").glob("*.json") if ".subset-" not in p.name]
    assert len(refs) == 1
    return refs[0]


def test_a_limit_base_run_writes_a_subset_reference_and_never_the_full_one(two_run_flow, tmp_path):
    root, _ = two_run_flow
    home = _copy_home(root, tmp_path)
    full = _full_reference(home)
    before = full.read_bytes()
    proc = lm_eval_here(f"pretrained={FIX['base']}", tmp_path / "o", home, extra=["--limit", "6"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert full.read_bytes() == before  # the full run's reference is untouched
    subsets = list((home / "references").glob("*.subset-*.json"))
    assert len(subsets) == 1 and len(json.loads(subsets[0].read_text())["cases"]) == 6
    results, _ = read_run(tmp_path / "o")
    assert toolfid_meta(results)["reference_subset"] is True
    # an adapter run of all 72 cases does not pair with a reference that covers 6 of them
    full.unlink()
    proc = lm_eval_here(f"pretrained={FIX['base']},peft={FIX['adapters']['faithful']}", tmp_path / "a", home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, _ = read_run(tmp_path / "a")
    assert metrics(results)["validity_delta"] is None  # unpaired: the column is there, null
    assert "covers 6 of the 72 cases" in toolfid_meta(results)["pairing"] and metrics(results)["validity_delta"] is None
    assert toolfid_meta(results)["verdict"]["label"] == "UNDECIDED"


def test_cached_requests_still_pair(two_run_flow, tmp_path, monkeypatch):
    """--cache_requests skips construct_requests; the request hashes are toolfid's own.

    Both runs through lm-eval's own entry point in this process (what is checked is the pairing of requests
    loaded from lm-eval's cache, not the console script: two console runs paid lm-eval's imports and task index
    twice, about 30 s). lm-eval reads ``LM_HARNESS_CACHE_PATH`` once, when ``lm_eval.caching.cache`` is imported,
    into its module global ``PATH`` (read at every cache access): set both, as a new process would see them."""
    import lm_eval.caching.cache as lm_eval_cache

    root, runs = two_run_flow
    cache = {"LM_HARNESS_CACHE_PATH": str(tmp_path / "cache")}
    monkeypatch.setattr(lm_eval_cache, "PATH", cache["LM_HARNESS_CACHE_PATH"])
    args = f"pretrained={FIX['base']},peft={FIX['adapters']['broken']}"
    for out in ("first", "second"):
        proc = lm_eval_here(args, tmp_path / out, root / "home", extra=["--cache_requests", "true"], env=cache)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results, _ = read_run(tmp_path / out)
        assert toolfid_meta(results)["pairing"].startswith("reference store")
        assert metrics(results)["validity_delta"] == pytest.approx(metrics(runs["broken"][0])["validity_delta"])
    assert any((tmp_path / "cache").iterdir())


def test_a_delta_weights_run_is_an_adapter_run(two_run_flow, tmp_path):
    root, _ = two_run_flow
    home = _copy_home(root, tmp_path)
    full = _full_reference(home)
    before = full.read_bytes()
    proc = lm_eval_here(f"pretrained={FIX['base']},delta={FIX['base']}", tmp_path / "o", home, extra=["--limit", "8"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, _ = read_run(tmp_path / "o")
    meta = toolfid_meta(results)
    assert meta["adapter_mechanism"] == "delta" and "reference_written" not in meta
    assert meta["pairing"].startswith("reference store") and "validity_delta" in metrics(results)
    assert full.read_bytes() == before and not list((home / "references").glob("*.subset-*"))


def test_mismatched_base_samples_are_refused_before_generation(two_run_flow, tmp_path):
    root, _ = two_run_flow
    base_samples = sorted((root / "base").rglob(f"samples_{FIXTURE_TASK}_*.jsonl"))[-1]
    proc = lm_eval_here(f"pretrained={FIX['base']},peft={FIX['adapters']['faithful']}", tmp_path / "o",
                       tmp_path / "h", metadata={"base_samples": str(base_samples), "demos": 1})
    assert proc.returncode != 0
    assert "cannot be paired: the base run differs in prompt" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("results_*.json"))


def test_an_unwritable_reference_dir_is_one_warning_and_the_results_are_kept(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the reference folder should be")
    proc = lm_eval_here(f"pretrained={FIX['base']}", tmp_path / "o", tmp_path / "h",
                       metadata={"reference_dir": str(blocker / "refs")}, extra=["--limit", "4"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("could not write the base reference") == 1 and "Traceback" not in proc.stderr
    results, samples = read_run(tmp_path / "o")
    assert len(samples) == 4 and "json_valid_rate" in metrics(results)
    assert "reference_not_written" in toolfid_meta(results)


def test_an_adapter_that_changes_nothing_passes_with_a_loud_note(two_run_flow, tmp_path):
    """A LoRA with B = 0 (PEFT's default init): outputs byte-identical to the base's."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(FIX["base"])
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    lora.save_pretrained(tmp_path / "b0")
    root, _ = two_run_flow
    proc = lm_eval_here(f"pretrained={FIX['base']},peft={tmp_path / 'b0'}", tmp_path / "o", root / "home")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, _ = read_run(tmp_path / "o")
    m, verdict = metrics(results), toolfid_meta(results)["verdict"]
    assert m["identical_output_rate"] == 1.0 and m["validity_delta"] == 0.0
    assert verdict["label"] == "PASS" and any("was it applied?" in n for n in verdict["notes"])


def test_with_a_prompt_the_base_cannot_follow_no_adapter_passes(tmp_path, monkeypatch):
    """The raw style (the bare request) is not what the tiny fixture model was trained on: its base makes
    almost no valid call, so no adapter can be shown to keep or lose anything."""
    from lm_eval_toolfid.reporting.results import row_from_results
    from lm_eval_toolfid.run.plan import ModelOptions, RunPlan
    from lm_eval_toolfid.run.runner import run_plan

    monkeypatch.setenv("TOOLFID_HOME", str(tmp_path / "home"))
    # 16 of the 72 cases (the adapters pair with the base's subset reference): the base follows almost none
    base, views = run_plan(RunPlan(FIX["base"], dict(FIX["adapters"]), FIXTURE_TASK, {"prompt_style": "raw"},
                                   models=ModelOptions(batch_size=16), limit=16))
    assert len(base.samples) == 16
    assert row_from_results(base.results, "base", FIXTURE_TASK).metric("json_valid_rate") < 0.2
    labels = {v.label: row_from_results(v.results, v.label, FIXTURE_TASK).verdict["label"] for v in views}
    assert set(labels.values()) == {"UNDECIDED"}, labels
    reason = row_from_results(views[0].results, "x", FIXTURE_TASK).verdict["reason"]
    assert "fidelity cannot be judged" in reason and "demos" in reason
