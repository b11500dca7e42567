"""``toolfid run --check-stops N`` (and metadata ``check_stops``) on the bundled fixture model.

A checked row runs on past its early stop, in the same decode batch, to where lm-eval's own generation ends;
both answers are scored. On the fixture every answer is the same (exit 0, one line per view); a stop rule made
wrong on purpose (rows cut after three tokens) is caught: the cases are listed and the command exits 3.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.cli import main
from lm_eval_toolfid.core.errors import EXIT_STOP_CHECK

FIX = fixture_paths()
TASK = "tool_use_fidelity_fixture"


def _run(tmp_path: Path, *extra: str) -> list[str]:
    return ["run", "--base", FIX["base"], "--adapter", f"faithful={FIX['adapters']['faithful']}", "--task", TASK,
            "--output", str(tmp_path / "out"), "--no-breakdown", "--batch-size", "16", *extra]


def _stop_check(out: Path, view: str) -> dict:
    results = json.loads((out / view / "results.json").read_text())
    return results["configs"][TASK]["metadata"]["toolfid"]["stop_check"]


@pytest.mark.parametrize("half", ["odd", pytest.param("even", marks=pytest.mark.slow)])
def test_check_stops_finds_nothing_on_the_fixture(toolfid_home: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture, half: str) -> None:
    """Every fixture case, in two halves: the fixture's case file line by line alternately (36 cases each: 24
    requests and 12 conversations), one half in the quick tier, the other with the slow tests, so the full suite
    still checks all 72."""
    from lm_eval_toolfid.cases.bundled import fixture_cases_path

    lines = [line for line in fixture_cases_path().read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(lines) == 72
    cases = tmp_path / "cases.jsonl"
    cases.write_text("\n".join(lines[1::2] if half == "odd" else lines[0::2]) + "\n", encoding="utf-8")
    code = main(_run(tmp_path, "--cases", str(cases), "--check-stops", "36"))
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    for view in ("base", "faithful"):
        check = _stop_check(tmp_path / "out", view)
        assert check["asked"] == 36 and check["rows"] == 36 and check["differ"] == 0, check
        assert f"check-stops: {view}: 36 cases decoded on past the early stop; every scored answer is the same" in err
    assert sum(json.loads(line)["id"].startswith("fx-m") for line in cases.read_text().splitlines()) == 12
    # a checked view is the same view: --resume reuses it without --check-stops, and the other way round
    assert main(_run(tmp_path, "--cases", str(cases), "--resume")) == 0


def test_a_wrong_stop_rule_is_caught_and_exits_3(toolfid_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    from lm_eval_toolfid.integrations.lm_eval import stopping

    original = stopping.RowStopper.push

    def cut_after_three(self, token):  # noqa: ANN001, ANN202 - a stop rule that is wrong on purpose
        reason = original(self, token)
        return reason or ("stop" if self.call_end and self.count >= 3 else None)

    monkeypatch.setattr(stopping.RowStopper, "push", cut_after_three)
    code = main(_run(tmp_path, "--check-stops", "8", "--limit", "8"))
    err = capsys.readouterr().err
    assert code == EXIT_STOP_CHECK, err[-2000:]
    check = _stop_check(tmp_path / "out", "base")
    assert check["rows"] == 8 and check["differ"] == 8
    first = check["cases"][0]
    assert first["outcome_stopped"] == "malformed" and first["outcome_unstopped"] == "valid"
    assert "check-stops: base: 8 of 8 cases score differently without the early stop" in err


def test_check_stops_in_lm_eval_metadata_with_a_plain_class_says_there_is_nothing_to_check(
        toolfid_home: Path, tmp_path: Path) -> None:
    """lm-eval's own HFLM never stops early: the check records that it had nothing to check."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lm_eval_toolfid.cases.bundled import tasks_path

    meta = {"pretrained": FIX["base"], "check_stops": 4}
    out = simple_evaluate(model="hf", model_args={"pretrained": FIX["base"]}, tasks=[TASK], limit=4, device="cpu",
                          task_manager=TaskManager(include_path=str(tasks_path()), include_defaults=False,
                                                   metadata=meta), bootstrap_iters=0)
    check = out["configs"][TASK]["metadata"]["toolfid"]["stop_check"]
    assert check["rows"] == 0 and "nothing to check" in check["note"]


def test_check_stops_on_the_generate_path(toolfid_home: Path) -> None:
    """A generation config the engine does not apply (repetition_penalty) sends the view through transformers'
    generate with the same per-row stop; its checked rows are generated again with lm-eval's own stopping."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lm_eval_toolfid.cases.bundled import tasks_path
    from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM

    lm = ToolfidHFLM(pretrained=FIX["base"], batch_size=8, device="cpu")
    lm.model.generation_config.repetition_penalty = 1.3
    manager = TaskManager(include_path=str(tasks_path()), include_defaults=False,
                          metadata={"pretrained": FIX["base"], "write_reference": False, "check_stops": 12})
    out = simple_evaluate(model=lm, model_args={"pretrained": FIX["base"]}, tasks=[TASK], task_manager=manager,
                          bootstrap_iters=0, limit=12)
    meta = out["configs"][TASK]["metadata"]["toolfid"]
    assert meta["generation"]["engine"] == "generate"
    assert meta["stop_check"]["rows"] == 12 and meta["stop_check"]["differ"] == 0, meta["stop_check"]
