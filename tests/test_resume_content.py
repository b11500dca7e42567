"""``--resume`` by content, on the fixture model (2 cases, the base and two adapters): a case edited in place makes
every view be computed again (the samples hold the new prompt), and a resume that leaves out a view the folder
holds, compared with the old base, is refused; an adapter's weights replaced make that view be
computed again and no other; a base computed again takes its adapter views with it (their manifests removed
first); each says what changed. A
prompt longer than the model's context is named with its length before anything is generated."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths

from .lm_eval_helpers import FIXTURE_TASK, toolfid_here

pytestmark = pytest.mark.slow
FIX = fixture_paths()
VIEWS = ["base", "faithful", "other"]


def _samples(out: Path, label: str) -> dict[str, dict]:
    rows = [json.loads(x) for x in (out / label / "samples.jsonl").read_text().splitlines() if x.strip()]
    return {r["doc"]["id"]: r for r in rows}


def _mtimes(out: Path) -> dict[str, int]:
    return {label: (out / label / "results.json").stat().st_mtime_ns for label in VIEWS}


def test_resume_reuses_a_view_only_for_the_same_cases_and_weights(tmp_path: Path) -> None:
    rows = [json.loads(x) for x in Path(FIX["cases"]).read_text().splitlines() if x.strip()][:2]
    cases, other, out, home = tmp_path / "cases.jsonl", tmp_path / "other", tmp_path / "out", tmp_path / "home"
    cases.write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.copytree(FIX["adapters"]["hallucinating"], other)
    args = ["run", "--base", FIX["base"], "--adapter", f"faithful={FIX['adapters']['faithful']}", "--adapter",
            f"other={other}", "--task", FIXTURE_TASK, "--device", "cpu", "--cases", str(cases), "--output", str(out),
            "--json"]
    first = toolfid_here(args, home)
    assert first.returncode == 0, first.stderr[-2000:]

    # a case's prompt edited in place: every view is computed again, on the new prompt
    edited = rows[1]["prompt"] + " Please."
    cases.write_text("".join(json.dumps({**r, "prompt": edited} if i == 1 else r) + "\n" for i, r in enumerate(rows)))
    before = _mtimes(out)
    without_other = args[:5] + args[7:]  # --adapter other=... left out: its saved view was made with the old base
    assert str(other) not in " ".join(without_other) and f"faithful={FIX['adapters']['faithful']}" in without_other
    alone = toolfid_here([*without_other, "--resume"], home)
    refusal = [line for line in alone.stderr.splitlines() if line.startswith("toolfid: error")]
    assert alone.returncode == 4 and len(refusal) == 1, alone.stderr[-2000:]
    assert "the base view is computed again (the cases changed since it was saved)" in refusal[0]
    assert "views this run does not compute, compared with the old base: other; name them with --adapter" \
        in refusal[0] and _mtimes(out) == before
    second = toolfid_here([*args, "--resume"], home)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "reusing" not in second.stderr
    assert "--resume: base is computed again: the cases changed since it was saved" in second.stderr, second.stderr
    assert "--resume: other is computed again: the cases changed since it was saved" in second.stderr
    after = _mtimes(out)
    assert all(after[label] != before[label] for label in VIEWS)
    for label in VIEWS:
        assert edited in json.dumps(_samples(out, label)[rows[1]["id"]]["arguments"]), label

    # one adapter's weights replaced: that view alone is computed again
    shutil.copy(Path(FIX["adapters"]["faithful"]) / "adapter_model.safetensors", other / "adapter_model.safetensors")
    before = _mtimes(out)
    third = toolfid_here([*args, "--resume"], home)
    assert third.returncode == 0, third.stderr[-2000:]
    assert third.stderr.count("reusing") == 2 and "other is computed again: the adapter's weights changed" \
        in third.stderr, third.stderr
    after = _mtimes(out)
    assert [label for label in VIEWS if after[label] != before[label]] == ["other"]
    report = json.loads(third.stdout)["adapters"]
    assert report["other"]["metrics"] == report["faithful"]["metrics"]  # the same weights now: the same answers

    # the base saved from other weights (its manifest says so): no adapter view is reused with it, and their
    # manifests go before anything runs (the runner's decision, read without running the views again)
    from lm_eval_toolfid.run.plan import RunPlan
    from lm_eval_toolfid.run.resume import read_folder

    plan = RunPlan(base=FIX["base"], adapters={"faithful": FIX["adapters"]["faithful"], "other": str(other)},
                   task=FIXTURE_TASK, metadata={"cases": str(cases)}, out_dir=out, resume=True)
    model_args = {"pretrained": FIX["base"]}  # ModelSession.manifest_args, no --dtype
    assert set(read_folder(plan, model_args).done) == {"base", "faithful", "other"}  # as the third run saw them
    manifest = json.loads((out / "base" / "manifest.json").read_text())
    (out / "base" / "manifest.json").write_text(json.dumps({**manifest, "base_fingerprint": "0" * 16}))
    assert read_folder(plan, model_args).done == {}
    assert [label for label in VIEWS if (out / label / "manifest.json").is_file()] == ["base"]


def test_a_prompt_longer_than_the_context_is_named_before_generating(tmp_path: Path) -> None:
    rows = [json.loads(x) for x in Path(FIX["cases"]).read_text().splitlines() if x.strip()][:2]
    rows[1]["prompt"] = "Please look this up. " * 600  # 12,600 characters; the fixture model reads 2,048 tokens
    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = toolfid_here(["run", "--base", FIX["base"], "--adapter", FIX["adapters"]["faithful"], "--task",
                         FIXTURE_TASK, "--device", "cpu", "--cases", str(cases), "--output", str(tmp_path / "out")],
                        tmp_path / "home")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("toolfid: error")]
    assert proc.returncode == 4 and len(errors) == 1, proc.stderr[-2000:]
    assert f"1 case(s) do not fit the model's context of 2,048 tokens: {rows[1]['id']} (" in errors[0], errors[0]
    assert "+ 128 generated tokens)" in errors[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "base" / "samples.jsonl").exists()
