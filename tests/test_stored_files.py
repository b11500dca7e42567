"""What is stored is checked before it is trusted: ``--resume`` reuses a saved view only when its samples, results
and manifest are the files that were saved and agree with each other, and a base view only when the base reference
it wrote still reads; anything else is computed again, with one line saying why, and gives the uninterrupted
answers."""

from __future__ import annotations

import json
import shutil

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths

from .lm_eval_helpers import toolfid_here

pytestmark = pytest.mark.slow
FIX = fixture_paths()


def _run(out, home, *extra):
    args = ["run", "--base", FIX["base"], "--adapter", f"faithful={FIX['adapters']['faithful']}", "--adapter",
            f"broken={FIX['adapters']['broken']}", "--task", "tool_use_fidelity_fixture", "--limit", "8", "--output", out,
            *extra]
    proc = toolfid_here(args, home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _answers(out, label):
    return [json.loads(line)["resps"] for line in (out / label / "samples.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("stored")
    out, home = root / "out", root / "home"
    _run(out, home)
    return root, out, home, {label: _answers(out, label) for label in ("base", "faithful", "broken")}


# garbage bytes and an empty file fail the same digest as a truncated one (the unit test of saved_files_problem below)
@pytest.mark.parametrize("damage,why", [
    ("truncate", "samples.jsonl is not the file that was saved"),
    ("other_adapter", "samples.jsonl is not the file that was saved"),
    ("results", "results.json is not the file that was saved"),
])
def test_a_damaged_view_is_computed_again_with_the_reason(saved, tmp_path, damage, why) -> None:
    root, out, home, answers = saved
    work = tmp_path / "out"
    shutil.copytree(out, work)
    samples = work / "faithful" / "samples.jsonl"
    if damage == "truncate":
        samples.write_bytes(samples.read_bytes()[:200])
    elif damage == "garbage":
        samples.write_bytes(b"\x00\xff" * 50)
    elif damage == "empty":
        samples.write_text("")
    elif damage == "other_adapter":  # the same case ids, another adapter's answers
        shutil.copy(work / "broken" / "samples.jsonl", samples)
    else:
        (work / "faithful" / "results.json").write_text("{}")
    proc = _run(work, home, "--resume")
    assert f"faithful is computed again: its {why}" in proc.stderr, proc.stderr[-2000:]
    assert "broken is computed again" not in proc.stderr  # the others are reused
    assert _answers(work, "faithful") == answers["faithful"]


def test_a_damaged_base_reference_recomputes_the_base_view(saved, tmp_path) -> None:
    root, out, home, answers = saved
    work, work_home = tmp_path / "out", tmp_path / "home"
    shutil.copytree(out, work)
    shutil.copytree(home, work_home)
    results = json.loads((work / "base" / "results.json").read_text())
    written = next(iter(results["configs"].values()))["metadata"]["toolfid"]["reference_written"]
    # the copy's base view names the original home's reference: point it at the copy, then damage that
    reference = work_home / written.split(str(home) + "/", 1)[1]
    (work / "base" / "results.json").write_text((work / "base" / "results.json").read_text().replace(
        written, str(reference)))
    manifest = json.loads((work / "base" / "manifest.json").read_text())
    from lm_eval_toolfid.reporting.view_store import _digest

    manifest["files"]["results.json"] = _digest(work / "base" / "results.json")
    (work / "base" / "manifest.json").write_text(json.dumps(manifest))
    reference.write_bytes(reference.read_bytes()[:100])
    proc = _run(work, work_home, "--resume")
    assert "base is computed again: the base reference it wrote" in proc.stderr and "is damaged" in proc.stderr
    assert _answers(work, "base") == answers["base"]
    verdicts = {label: json.loads((work / label / "results.json").read_text()) for label in ("faithful", "broken")}
    labels = {k: next(iter(v["configs"].values()))["metadata"]["toolfid"]["verdict"]["label"]
              for k, v in verdicts.items()}
    reasons = {k: next(iter(v["configs"].values()))["metadata"]["toolfid"]["verdict"]["reason"] for k, v in verdicts.items()}
    assert labels == {"faithful": "PASS", "broken": "FAIL"}, (reasons, proc.stderr[-3000:])  # paired again


@pytest.mark.parametrize("content,why", [(b"", "not the file"), (b"\x00\xff" * 9, "not the file"),
                                         (None, "older version")])
def test_saved_files_problem_names_each_damage(tmp_path, content, why) -> None:
    from lm_eval_toolfid.reporting.view_store import _digest, saved_files_problem

    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "samples.jsonl").write_text(json.dumps({"doc": {"id": "a"}}) + "\n")
    digests = {name: _digest(tmp_path / name) for name in ("results.json", "samples.jsonl")}
    assert saved_files_problem(tmp_path, {}, digests) is None
    if content is not None:
        (tmp_path / "samples.jsonl").write_bytes(content)
    assert why in str(saved_files_problem(tmp_path, {}, digests if content is not None else None))


def test_resume_runs_the_checks_it_is_asked_for(saved, tmp_path) -> None:
    """``--check-stops`` or ``--no-prefix-cache`` added on ``--resume`` change what a view checks: the views are
    computed again (the stop check runs), said in one line; the same command again reuses every view."""
    root, out, home, answers = saved
    work = tmp_path / "out"
    shutil.copytree(out, work)
    proc = _run(work, home, "--resume", "--check-stops", "2")
    assert "base is computed again: the checks asked (--check-stops, --no-prefix-cache) changed" in proc.stderr
    results = json.loads((work / "base" / "results.json").read_text())
    assert next(iter(results["configs"].values()))["metadata"]["toolfid"]["stop_check"]["rows"] >= 1
    assert _answers(work, "faithful") == answers["faithful"]
    again = _run(work, home, "--resume", "--check-stops", "2")
    assert "computed again" not in again.stderr and again.stderr.count("reusing") == 3
