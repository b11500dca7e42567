"""Views decoded together (issue 37): ``toolfid run`` decodes the base and its adapters in one engine run, each row
under its own LoRA (PEFT's mixed batch), and every view's answers are the answers of that view run alone.

Checked through the real CLI (in process, so memory can be made scarce), case by case:

- the bundled fixture, all four adapters, float32: adapters verifying the base's answers together (the default),
  and the base decoding with the adapters (``--no-verify``), each equal to ``--views-together 1``;
- fewer views than the run has fit in memory: the views go in groups, the header says so, the answers are the same;
- a joint run interrupted after two saved views and resumed: the uninterrupted run's answers;
- SmolLM2-135M-Instruct, float32: a B = 0 LoRA and a trained LoRA, together and alone, decoded and verified.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.cli import main

from .lm_eval_helpers import FIXTURE_TASK
from .lora_recipes import Recipe, trained_lora, zero_lora

pytestmark = pytest.mark.slow
FIX = fixture_paths()
ADAPTERS = ["faithful", "hallucinating", "broken", "prose_after_results"]
LIMIT = 24
PROSE = "I would rather tell you about bread: flour, water, salt and a patient night in a cool kitchen."


def _main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _fixture_run(out: Path, *extra: Any) -> tuple[int, str, str]:
    args: list[Any] = ["run", "--base", FIX["base"], "--task", FIXTURE_TASK, "--device", "cpu", "--limit", LIMIT,
                       "--no-breakdown", "--output", out]
    for name in ADAPTERS:
        args += ["--adapter", f"{name}={FIX['adapters'][name]}"]
    return _main([*args, *extra])


def _answers(out: Path) -> dict[str, dict[str, Any]]:
    """Every view folder of a run: case id -> the generated text."""
    views = {}
    for folder in sorted(p for p in out.iterdir() if (p / "samples.jsonl").is_file()):
        rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
        views[folder.name] = {r["doc"]["id"]: r["resps"] for r in rows}
    return views


def _generation(out: Path, view: str, task: str = FIXTURE_TASK) -> dict[str, Any]:
    results = json.loads((out / view / "results.json").read_text())
    return results["configs"][task]["metadata"]["toolfid"]["generation"]


def _assert_same(together: dict[str, dict[str, Any]], alone: dict[str, dict[str, Any]], n: int) -> None:
    assert sorted(together) == sorted(alone) and len(together) >= 2
    for view in alone:
        assert len(alone[view]) == n
        differ = [cid for cid in alone[view] if together[view].get(cid) != alone[view][cid]]
        assert not differ, f"{view}: {len(differ)} of {n} answers differ from the view run alone: {differ[:5]}"


@pytest.fixture(scope="module")
def fixture_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("joint")
    mp = pytest.MonkeyPatch()
    mp.setenv("TOOLFID_HOME", str(root / "home"))
    runs: dict[str, Any] = {"root": root}
    try:
        for name, extra in {"alone": ["--views-together", 1], "together": [],
                            "alone_decoded": ["--views-together", 1, "--no-verify"],
                            "together_decoded": ["--no-verify"]}.items():
            runs[name] = _fixture_run(root / name, *extra)
            assert runs[name][0] in (0, 1), runs[name][2][-3000:]
    finally:
        mp.undo()
    return runs


def test_fixture_adapters_verified_together_equal_each_alone(fixture_runs: dict[str, Any]) -> None:
    root = fixture_runs["root"]
    _assert_same(_answers(root / "together"), _answers(root / "alone"), LIMIT)
    for name in ADAPTERS:  # the adapters verified the base's answers in one engine run, the base ran before them
        gen = _generation(root / "together", name)
        assert gen["views_together"] == ADAPTERS and gen["verify"] is True and gen["rows_verified"] > 0
        assert "views_together" not in _generation(root / "alone", name)
    assert "views_together" not in _generation(root / "together", "base")
    _, stdout, stderr = fixture_runs["together"]
    # the progress line of the first view of the group says what was decoded together, and the others take no time
    assert f"{' + '.join(ADAPTERS)}, decoded together: {len(ADAPTERS)} × {LIMIT} cases in " in stderr, stderr
    for name in ADAPTERS[1:]:
        assert f"{name}: {LIMIT} cases (decoded above, together with {ADAPTERS[0]})" in stderr
    assert "decoded together" not in stdout  # the screen leaves the engine's account to --verbose
    assert "decoded together" not in fixture_runs["alone"][1] + fixture_runs["alone"][2]


def test_fixture_base_decoded_with_its_adapters_equals_each_alone(fixture_runs: dict[str, Any]) -> None:
    root = fixture_runs["root"]
    _assert_same(_answers(root / "together_decoded"), _answers(root / "alone_decoded"), LIMIT)
    _assert_same(_answers(root / "together_decoded"), _answers(root / "alone"), LIMIT)  # verified = decoded
    for name in ["base", *ADAPTERS]:
        gen = _generation(root / "together_decoded", name)
        assert gen["views_together"] == ["base", *ADAPTERS] and gen.get("rows_verified", 0) == 0


def test_more_views_than_memory_holds_go_in_groups_and_say_so(fixture_runs: dict[str, Any], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import lm_eval_toolfid.integrations.lm_eval.batch_size as bs

    monkeypatch.setenv("TOOLFID_HOME", str(fixture_runs["root"] / "home"))
    monkeypatch.setattr(bs, "rows_in_memory", lambda model, device, row_tokens: 2 * LIMIT + 3)
    code, stdout, stderr = _fixture_run(tmp_path / "out", "--no-verify")
    assert code in (0, 1), stderr[-3000:]
    _assert_same(_answers(tmp_path / "out"), _answers(fixture_runs["root"] / "alone_decoded"), LIMIT)
    groups = [_generation(tmp_path / "out", view).get("views_together") for view in ["base", *ADAPTERS]]
    assert groups == [["base", "faithful"]] * 2 + [["hallucinating", "broken"]] * 2 + [None]  # the last one alone
    text = " ".join(stderr.split())  # the progress lines say the groups, and a note under them why
    assert "views decoded 2 at a time" in text and "a view has 24" in text, stderr
    assert f"[1/5] base + faithful, decoded together: 2 × {LIMIT} cases in" in text
    assert f"[3/5] hallucinating + broken, decoded together: 2 × {LIMIT} cases in" in text
    assert f"[5/5] prose_after_results: {LIMIT} cases in" in text


def test_a_joint_run_interrupted_and_resumed_gives_the_uninterrupted_answers(
        fixture_runs: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lm_eval_toolfid.run.runner as runner

    monkeypatch.setenv("TOOLFID_HOME", str(fixture_runs["root"] / "home"))
    saved: list[str] = []
    real_save = runner.save_view

    def save_two(result: Any, *args: Any, **kwargs: Any) -> Any:
        if len(saved) == 2:
            raise KeyboardInterrupt
        saved.append(result.label)
        return real_save(result, *args, **kwargs)

    monkeypatch.setattr(runner, "save_view", save_two)
    out = tmp_path / "out"
    code, _, stderr = _fixture_run(out, "--no-verify")
    assert code == 130 and saved == ["base", "faithful"], stderr[-2000:]
    monkeypatch.setattr(runner, "save_view", real_save)
    code, stdout, stderr = _fixture_run(out, "--no-verify", "--resume")
    assert code in (0, 1), stderr[-3000:]
    assert stderr.count("reusing") == 2
    _assert_same(_answers(out), _answers(fixture_runs["root"] / "together_decoded"), LIMIT)
    assert _generation(out, "broken")["views_together"] == ["hallucinating", "broken", "prose_after_results"]


SMOL_CASES = ("shipping-0008", "home-0002")
"""Two default cases: ``shipping-0008``, one of the 4 the prose LoRA is trained on (the first 4 default cases), where
its answer differs from the base's (asserted), so a B = 0 row run under the prose LoRA, or a prose row under no LoRA,
changes it; and ``home-0002``, the shortest plain-v3 prompt of the cases it was not trained on. The first 6 cases
before cost a long plain-v3 prompt pass each per view and run (prefill dominates: 2,862 prompt tokens a view, 751
now); the other 4 were more of these two kinds."""


def test_smollm2_zero_and_trained_lora_together_equal_each_alone(smollm2: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """float32, real weights: a B = 0 LoRA and a LoRA trained to answer prose on some cases, decoded with the base
    (``--no-verify``), against each view alone. Verified together (the default in float32) against each view alone on
    a real model is tests/test_qwen_coder.py's (``toolfid run``'s verified prose view against ``lm_eval --model hf …
    peft=``, case by case) and this module's fixture tests; this test ran it a third time (about 20 s) and no longer
    does."""
    from lm_eval_toolfid.cases.bundled import default_cases_path
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.prompts.prompter import Prompter

    rows = [json.loads(x) for x in default_cases_path().read_text(encoding="utf-8").splitlines() if x.strip()]
    cases_file = tmp_path / "cases.jsonl"  # a short budget: the prose adapter writes on to it
    cases_file.write_text("".join(json.dumps({**row, "max_new_tokens": 48}) + "\n" for row in rows
                                  if row["id"] in SMOL_CASES))
    every = load_cases(str(default_cases_path()))
    prompter = Prompter("auto", demos=None, model_args={"pretrained": str(smollm2)}, plain_demos=1,
                        template="plain-v3", cases=every)
    trained = trained_lora(smollm2, Recipe(contexts=tuple(prompter.render(c) for c in every[:4]), target=PROSE,
                                           steps=8))
    n = len(SMOL_CASES)
    # trained above under the machine's test home (cached by recipe: trained once per machine); the runs below
    # in a home of their own
    monkeypatch.setenv("TOOLFID_HOME", str(tmp_path / "home"))
    zero = zero_lora(smollm2, tmp_path / "zero")
    common: list[Any] = ["run", "--base", smollm2, "--adapter", f"zero={zero}", "--adapter", f"prose={trained}",
                         "--device", "cpu", "--dtype", "float32", "--cases", cases_file, "--no-breakdown"]
    runs = {}
    for name, extra in {"alone": ["--views-together", 1, "--no-verify"], "together": ["--no-verify"]}.items():
        code, stdout, stderr = _main([*common, *extra, "--output", tmp_path / name])
        assert code in (0, 1), stderr[-3000:]
        runs[name] = _answers(tmp_path / name)
    _assert_same(runs["together"], runs["alone"], n)
    assert runs["alone"]["zero"] == runs["alone"]["base"]
    # the trained adapter changed the answer of the case it was trained on: a row under the wrong LoRA shows
    assert runs["alone"]["prose"]["shipping-0008"] != runs["alone"]["base"]["shipping-0008"]
    assert _generation(tmp_path / "together", "prose", "tool_use_fidelity")["views_together"] == ["base", "zero", "prose"]
