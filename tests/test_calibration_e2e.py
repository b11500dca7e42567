"""Null calibration end to end on the fixture model: in-process, post hoc from lm_eval runs, scoring."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.calibration.posthoc import calibrate_from_results, score_results
from lm_eval_toolfid.run.calibrate import calibrate_in_process
from lm_eval_toolfid.calibration.adapters import adapter_update_norm
from lm_eval_toolfid.calibration.fit import load_calibration
from lm_eval_toolfid.calibration.nulls import CalibrationSpec
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.run.plan import RunPlan
from lm_eval_toolfid.run.runner import run_plan

from .lm_eval_helpers import BIN, FIXTURE_TASK, lm_eval_in_process, metrics, toolfid_here, toolfid_meta

pytestmark = pytest.mark.slow
FIX = fixture_paths()
K = 2
"""Null runs per calibration: the fewest that give a sample spread (K = 1 is the degenerate case, checked through
``toolfid run --null-runs 1`` below); each null run is a view of every fixture case, in the calibration, in its
same-seed repeat and again through lm_eval post hoc (K = 3 cost a third more and checked nothing K = 2 does not)."""


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    root = tmp_path_factory.mktemp("calib")
    import os
    os.environ["TOOLFID_HOME"] = str(root / "home")
    out = root / "calib.json"
    calibrate_in_process(FIX["base"], FIX["adapters"]["faithful"],
                         CalibrationSpec(K, out, seed=11, multipliers=(1.0,), null_dir=root / "nulls"), FIXTURE_TASK, {})
    return root, out


def test_in_process_calibration_fits_every_metric(calibrated):
    _, out = calibrated
    cal = load_calibration(out)
    fits = cal.fits["1"]
    assert set(fits) == {"json_valid_rate", "parse_rate", "hallucination_rate", "validity_delta"}
    for f in fits.values():
        assert f.n == K and len(f.values) == K and f.std_used > 0 and math.isfinite(f.std_used)
    prov = cal.provenance
    assert prov["case_set"] and prov["base"]["fingerprint"] and prov["adapter_shape"] and prov["seeds"] == [11]
    assert prov["adapter_update_norm"] == pytest.approx(adapter_update_norm(FIX["adapters"]["faithful"]))
    assert set(prov["versions"]) >= {"torch", "transformers", "peft", "lm_eval"}


def test_same_seed_gives_a_byte_identical_file(calibrated, tmp_path):
    root, out = calibrated
    again = tmp_path / "again.json"
    calibrate_in_process(FIX["base"], FIX["adapters"]["faithful"],
                         CalibrationSpec(K, again, seed=11, multipliers=(1.0,), null_dir=tmp_path / "nulls"),
                         FIXTURE_TASK, {})
    assert again.read_bytes() == out.read_bytes()


def test_z_and_rank_p_in_a_real_run(calibrated, tmp_path):
    _, out = calibrated
    cal = load_calibration(out)
    _, views = run_plan(RunPlan(FIX["base"], {"faithful": FIX["adapters"]["faithful"]}, FIXTURE_TASK,
                                {"calibration": str(out)}, out_dir=tmp_path))
    m, meta = metrics(views[0].results), toolfid_meta(views[0].results)
    assert math.isfinite(m["json_valid_z"]) and "1" in meta["z_profile"]
    null = meta["null"]
    values = cal.fits["1"]["json_valid_rate"].values
    assert null["k"] == K and null["rank_p"] == pytest.approx(
        (1 + sum(v >= m["json_valid_rate"] for v in values)) / (K + 1))
    assert f"K={K} null runs cannot show p ≤ 0.05" in null["rank_note"]
    assert null["z"] == pytest.approx(m["json_valid_z"])


def test_from_results_agrees_with_in_process(calibrated, tmp_path):
    from lm_eval_toolfid.cli import main

    root, out = calibrated
    home = root / "home"  # the base reference written during calibration is in this store
    nulls = sorted((root / "nulls").iterdir())
    for null in nulls:  # each null's run as lm-eval writes it (in this process: the files are what is read here)
        code, err = lm_eval_in_process(f"pretrained={FIX['base']},peft={null}", tmp_path / null.name, home)
        assert code == 0, err[-2000:]
    # toolfid score on a null's own results (same norm as the real adapter: compatible); input untouched
    results_file = sorted((tmp_path / nulls[0].name).rglob("results_*.json"))[-1]
    before = results_file.read_bytes()
    assert main(["score", str(results_file), "--calibration", str(out)]) == 0
    assert results_file.read_bytes() == before
    scored = json.loads(results_file.with_name(results_file.stem + ".scored.json").read_text())["toolfid_score"]
    assert math.isfinite(scored["json_valid_z"]) and scored["null"]["k"] == K
    assert scored["json_valid_rank_p"] >= 1 / (K + 1)
    # overlapping paths and the .scored.json beside the runs change nothing
    post = calibrate_from_results([str(tmp_path), str(results_file), str(tmp_path / nulls[1].name)],
                                  tmp_path / "post.json", FIXTURE_TASK)
    live = load_calibration(out)
    assert post.fits == live.fits
    assert [r.model_dump() for r in post.runs] == [r.model_dump() for r in live.runs]
    assert {k: v for k, v in post.provenance.items()} == live.provenance


def test_calibration_is_refused_for_another_case_set_or_base(calibrated, tmp_path):
    _, out = calibrated
    subset = tmp_path / "subset.jsonl"
    subset.write_text("\n".join(open(FIX["cases"]).read().splitlines()[:10]) + "\n")
    with pytest.raises(SystemExit, match="another case set"):
        run_plan(RunPlan(FIX["base"], {"f": FIX["adapters"]["faithful"]}, FIXTURE_TASK,
                         {"calibration": str(out), "cases": str(subset)}))
    # a copy of the base elsewhere is the same base (identity is content, not path) ...
    copy = tmp_path / "base-copy"
    shutil.copytree(FIX["base"], copy)
    _, views = run_plan(RunPlan(str(copy), {"f": FIX["adapters"]["faithful"]}, FIXTURE_TASK, {"calibration": str(out)}))
    assert "json_valid_z" in metrics(views[0].results)
    # ... a base with other weights is not
    from safetensors.torch import load_file, save_file

    other_base = tmp_path / "base-other"
    shutil.copytree(FIX["base"], other_base)
    weights = next(other_base.glob("*.safetensors"))
    state = load_file(str(weights))
    name = sorted(state)[0]
    state[name] = state[name] + 0.01
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(SystemExit, match="another base model .*fingerprint"):
        run_plan(RunPlan(str(other_base), {"f": FIX["adapters"]["faithful"]}, FIXTURE_TASK, {"calibration": str(out)}))


def test_score_refuses_a_calibration_made_for_another_update_norm(calibrated, tmp_path):
    root, out = calibrated
    # the run's files are what `toolfid score` reads: made in this process; the score command is the console script
    code, err = lm_eval_in_process(f"pretrained={FIX['base']},peft={FIX['adapters']['broken']}", tmp_path / "r",
                                   root / "home")
    assert code == 0, err[-2000:]
    results_file = sorted((tmp_path / "r").rglob("results_*.json"))[-1]
    # broken has the faithful adapter's shape but another update norm: the faithful calibration does not fit it
    cli = subprocess.run([str(BIN / "toolfid"), "score", str(results_file), "--calibration", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode != 0
    assert cli.stderr.count("\n") == 1 and "update norm" in cli.stderr and "calibrate --adapter" in cli.stderr
    assert not results_file.with_name(results_file.stem + ".scored.json").exists()
    # a calibration file for another case set is refused in one line
    bad = json.loads(out.read_text())
    bad["provenance"]["case_set"] = "0000"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ToolfidError, match="another case set"):
        score_results(str(results_file), str(tmp_path / "bad.json"))


def _but_drafts(report: dict) -> dict:
    """A run's adapters as reported, less where the tokens an adapter view verified came from (the base view of
    the same session, or the base reference stored on disk when that view was reused)."""
    return {label: {k: v for k, v in row.items() if k != "generation"} for label, row in report["adapters"].items()}


def test_toolfid_run_with_null_runs_calibrates_and_scores_in_one_go(tmp_path):
    import os

    env = dict(os.environ, TOOLFID_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1")
    cmd = [str(BIN / "toolfid"), "run", "--base", FIX["base"], "--task", FIXTURE_TASK,
           "--null-runs", "1", "--seed", "3", "--output", str(tmp_path / "out"), "--json"]
    # one calibration serves one update norm: two adapters of different norms are refused before any model loads
    both = subprocess.run(cmd + ["--adapter", f"faithful={FIX['adapters']['faithful']}",
                                 "--adapter", f"broken={FIX['adapters']['broken']}"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert both.returncode == 4 and "differ (faithful" in both.stderr, both.stderr[-2000:]
    # the run whose report and files are checked, in this process (the refusal above is the console script's)
    proc = toolfid_here(cmd[1:] + ["--adapter", f"broken={FIX['adapters']['broken']}"], tmp_path / "home")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    broken = report["adapters"]["broken"]
    assert math.isfinite(broken["metrics"]["json_valid_z"])
    cal = load_calibration(tmp_path / "out" / "calibration.json")
    assert set(cal.fits) == {"0.5", "1", "2"} and all(f["json_valid_rate"].n == 1 for f in cal.fits.values())
    assert cal.provenance["adapter_update_norm"] == pytest.approx(adapter_update_norm(FIX["adapters"]["broken"]))
    assert broken["null"]["k"] == 1 and broken["null"]["degenerate"] and "K=1" in broken["null"]["rank_note"]
    assert broken["verdict"]["passed"] is False
    # each null's per-case answers kept beside the calibration, one sample line per case
    kept = sorted((tmp_path / "out" / "null_samples").glob("*.jsonl"))
    assert [p.stem for p in kept] == [r.name for r in cal.runs] == ["null_00", "null_01", "null_02"]
    assert all(len(p.read_text().splitlines()) == r.n_cases for p, r in zip(kept, cal.runs))
    # --resume reuses the base view, the calibration and the adapter view (nothing loads), with the same report
    again = toolfid_here(cmd[1:] + ["--adapter", f"broken={FIX['adapters']['broken']}", "--resume"],
                         tmp_path / "home")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "computed again" not in again.stderr and "loading" not in again.stderr, again.stderr
    assert json.loads(again.stdout)["adapters"] == report["adapters"]
    # a null's answers damaged since: the calibration and the adapter view judged against it are computed again,
    # the base view is reused; the same seed gives the same nulls, so the same report
    kept[1].write_text(kept[1].read_text()[:-20])
    third = toolfid_here(cmd[1:] + ["--adapter", f"broken={FIX['adapters']['broken']}", "--resume"],
                         tmp_path / "home")
    assert third.returncode == 0, third.stderr[-2000:]
    assert "the calibration is computed again: its null_samples/null_01.jsonl is not the file that was saved" \
        in third.stderr, third.stderr
    assert "broken is computed again: the calibration it is judged against is computed again" in third.stderr
    assert "base: reusing" in third.stderr, third.stderr
    assert _but_drafts(json.loads(third.stdout)) == _but_drafts(report)  # drafts: the stored reference's
    assert len(kept[1].read_text().splitlines()) == cal.runs[1].n_cases
    # another seed: another calibration (said), the base view still reused
    seed = toolfid_here([*cmd[1:-5], "--seed", "4", *cmd[-3:], "--adapter", f"broken={FIX['adapters']['broken']}",
                         "--resume"], tmp_path / "home")
    assert seed.returncode == 0, seed.stderr[-2000:]
    assert "the calibration is computed again: --seed changed since it was made" in seed.stderr, seed.stderr
    assert load_calibration(tmp_path / "out" / "calibration.json").provenance["seeds"] == [4]
