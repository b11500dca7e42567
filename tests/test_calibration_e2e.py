"""Null calibration end to end on the fixture model: in-process, post hoc from lm_eval runs, scoring."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import pytest

from lm_eval_toolfid.bundled import fixture_paths
from lm_eval_toolfid.calibrate import calibrate_from_results, calibrate_in_process, score_results
from lm_eval_toolfid.calibration import load_calibration
from lm_eval_toolfid.errors import ToolfidError
from lm_eval_toolfid.runner import run_views

from .lm_eval_helpers import BIN, FIXTURE_TASK, lm_eval_cli, metrics, toolfid_meta

pytestmark = pytest.mark.slow
FIX = fixture_paths()
K = 3


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    root = tmp_path_factory.mktemp("calib")
    import os
    os.environ["TOOLFID_HOME"] = str(root / "home")
    out = root / "calib.json"
    calibrate_in_process(FIX["base"], FIX["adapters"]["faithful"], K, out, FIXTURE_TASK, {}, seed=11,
                         multipliers=(1.0,), null_dir=root / "nulls")
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
    assert set(prov["versions"]) >= {"torch", "transformers", "peft", "lm_eval"}


def test_same_seed_gives_a_byte_identical_file(calibrated, tmp_path):
    root, out = calibrated
    again = tmp_path / "again.json"
    calibrate_in_process(FIX["base"], FIX["adapters"]["faithful"], K, again, FIXTURE_TASK, {}, seed=11,
                         multipliers=(1.0,), null_dir=tmp_path / "nulls")
    assert again.read_bytes() == out.read_bytes()


def test_z_scores_separate_faithful_from_broken(calibrated, tmp_path):
    _, out = calibrated
    adapters = {"faithful": FIX["adapters"]["faithful"], "broken": FIX["adapters"]["broken"],
                "hallucinating": FIX["adapters"]["hallucinating"]}
    _, views = run_views(FIX["base"], adapters, FIXTURE_TASK, {"calibration": str(out)}, out_dir=tmp_path)
    z = {v.label: metrics(v.results)["json_valid_z"] for v in views}
    assert all(math.isfinite(x) for x in z.values()), z
    assert z["faithful"] > z["broken"] + 3, z
    meta = toolfid_meta(views[0].results)
    assert "1" in meta["z_profile"]


def test_from_results_agrees_with_in_process(calibrated, tmp_path):
    root, out = calibrated
    home = root / "home"  # the base reference written during calibration is in this store
    nulls = sorted((root / "nulls").iterdir())
    for null in nulls:
        proc = lm_eval_cli(f"pretrained={FIX['base']},peft={null}", tmp_path / null.name, home)
        assert proc.returncode == 0, proc.stderr[-2000:]
    post = calibrate_from_results([str(tmp_path)], tmp_path / "post.json", FIXTURE_TASK)
    live = load_calibration(out)
    assert post.fits == live.fits
    assert [r.model_dump() for r in post.runs] == [r.model_dump() for r in live.runs]
    assert {k: v for k, v in post.provenance.items()} == live.provenance


def test_calibration_is_refused_for_another_case_set_or_base(calibrated, tmp_path):
    _, out = calibrated
    subset = tmp_path / "subset.jsonl"
    subset.write_text("\n".join(open(FIX["cases"]).read().splitlines()[:10]) + "\n")
    with pytest.raises(SystemExit, match="another case set"):
        run_views(FIX["base"], {"f": FIX["adapters"]["faithful"]}, FIXTURE_TASK,
                  {"calibration": str(out), "cases": str(subset)})
    other_base = tmp_path / "base-copy"
    shutil.copytree(FIX["base"], other_base)
    with pytest.raises(SystemExit, match="another base model"):
        run_views(str(other_base), {"f": FIX["adapters"]["faithful"]}, FIXTURE_TASK, {"calibration": str(out)})


def test_score_adds_z_to_existing_results_without_overwriting(calibrated, tmp_path):
    root, out = calibrated
    proc = lm_eval_cli(f"pretrained={FIX['base']},peft={FIX['adapters']['broken']}", tmp_path / "r", root / "home")
    assert proc.returncode == 0, proc.stderr[-2000:]
    results_file = sorted((tmp_path / "r").rglob("results_*.json"))[-1]
    before = results_file.read_bytes()
    cli = subprocess.run([str(BIN / "toolfid"), "score", str(results_file), "--calibration", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    assert results_file.read_bytes() == before
    scored = json.loads(results_file.with_name(results_file.stem + ".scored.json").read_text())
    assert math.isfinite(scored["toolfid_score"]["json_valid_z"])
    assert scored["toolfid_score"]["verdict"]["passed"] is False
    # a calibration file for another case set is refused in one line
    bad = json.loads(out.read_text())
    bad["provenance"]["case_set"] = "0000"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ToolfidError, match="another case set"):
        score_results(str(results_file), str(tmp_path / "bad.json"))


def test_toolfid_run_with_null_runs_calibrates_and_scores_in_one_go(tmp_path):
    import os

    env = dict(os.environ, TOOLFID_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1")
    proc = subprocess.run([str(BIN / "toolfid"), "run", "--base", FIX["base"], "--task", FIXTURE_TASK,
                           "--adapter", f"faithful={FIX['adapters']['faithful']}",
                           "--adapter", f"broken={FIX['adapters']['broken']}",
                           "--null-runs", "1", "--seed", "3", "--output", str(tmp_path / "out"), "--json"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    z = {name: a["metrics"]["json_valid_z"] for name, a in report["adapters"].items()}
    assert all(math.isfinite(v) for v in z.values()) and z["faithful"] > z["broken"]
    cal = load_calibration(tmp_path / "out" / "calibration.json")
    assert set(cal.fits) == {"0.5", "1", "2"} and all(f["json_valid_rate"].n == 1 for f in cal.fits.values())
    assert report["adapters"]["broken"]["verdict"]["passed"] is False
