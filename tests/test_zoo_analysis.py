"""bench/bench_zoo.py, the measured error rates of docs/validation.md, on the fixture demo's real views:
its verdicts come from the task's own functions (the whole-set verdict equals the one each view recorded),
resampled case sets keep a clear failure a failure, and the adapters it trains learn what their member
says, built from the base's own answers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .lm_eval_helpers import toolfid_here

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

VIEWS = ["faithful", "hallucinating", "broken", "prose_after_results"]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zoo")
    proc = toolfid_here(["demo", "--no-breakdown", "--output", tmp / "out"], tmp / "home")  # in this process
    assert proc.returncode == 0, proc.stderr[-2000:]
    return tmp / "out"


@pytest.mark.slow
def test_whole_set_verdicts_are_the_views_own_and_resampling_keeps_clear_failures(demo_run):
    import bench_zoo

    rows = bench_zoo.analyse(demo_run, VIEWS, ns=[24, 72], subsets=25, seed=0)
    assert set(rows) == set(VIEWS)
    for label, row in rows.items():
        results = json.loads((demo_run / label / "results.json").read_text(encoding="utf-8"))
        recorded = next(iter(results["configs"].values()))["metadata"]["toolfid"]["verdict"]
        expected = "UNDECIDED" if recorded["passed"] is None else ("PASS" if recorded["passed"] else "FAIL")
        assert row["verdict"] == expected, (label, row["reason"], recorded["reason"])
        for n in (24, 72):
            shares = row["subsets"][n]
            for way in ("measured", "by_domain", "predicted", "predicted_strata"):
                assert abs(sum(shares[way].values()) - 1.0) < 1e-6, (label, n, way, shares[way])
    broken = rows["broken"]
    assert broken["verdict"] == "FAIL" and broken["lost"] > 0.9 * broken["relevant"]
    assert broken["subsets"][72]["measured"]["FAIL"] == 1.0 and broken["subsets"][72]["predicted"]["FAIL"] > 0.99
    prose = rows["prose_after_results"]  # the multi-turn failure the fixture adapter was trained for
    assert prose["multi_turn_delta"] < -0.5 and prose["single_turn_delta"] == 0.0
    assert rows["faithful"]["verdict"] == "PASS"
    assert rows["faithful"]["subsets"][72]["measured"]["FAIL"] <= 0.2


@pytest.mark.slow
def test_members_are_built_from_the_base_answers(demo_run):
    import bench_zoo

    answers = bench_zoo.base_answers(demo_run)
    assert len(answers) == 72 and sum(a.multi for a in answers.values()) == 24
    own = {a.text + bench_zoo.END_OF_TURN for a in answers.values()}
    faithful = bench_zoo.recipe_for("faithful-s0", answers, 0)
    assert faithful.targets and set(faithful.targets) <= own
    assert bench_zoo.recipe_for("faithful-s1", answers, 1).contexts != faithful.contexts  # another seed, other cases
    assert bench_zoo.recipe_for("faithful-s0", answers, 0) == faithful  # the seed rebuilds it
    overfit = bench_zoo.recipe_for("overfit-s0", answers, 0)  # the first faithful recipe, fitted hard
    assert set(overfit.targets) <= own and overfit.must_learn and not faithful.must_learn
    assert overfit.lr > faithful.lr and overfit.steps > faithful.steps and len(overfit.contexts) <= len(faithful.contexts)
    renamed = bench_zoo.recipe_for("renamed", answers, 0)
    assert any('_v2"' in t for t in renamed.targets)
    fmt = bench_zoo.recipe_for("format", answers, 0)
    assert fmt.targets and all(t.startswith("<tool_call>\n{") for t in fmt.targets)
    prose = bench_zoo.recipe_for("prose-results", answers, 0)
    multi = {a.context for a in answers.values() if a.multi}
    assert all(t in bench_zoo.PROSE_AFTER_RESULTS for c, t in zip(prose.contexts, prose.targets)
               for t in [t.removesuffix(bench_zoo.END_OF_TURN)] if c in multi)
    assert sum(c in multi for c in prose.contexts) == 10
    drift = bench_zoo.recipe_for("drift", answers, 0)
    assert drift.targets and not set(drift.targets) & own
