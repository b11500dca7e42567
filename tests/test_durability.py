"""Durable, honest reference files: atomic writes, concurrent writers, corrupt files, rank 0 only."""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.integrations.lm_eval.fidelity_run import FidelityRun
from lm_eval_toolfid.core.fsutil import atomic_write_text
from lm_eval_toolfid.pairing.identity import RunKey
from lm_eval_toolfid.pairing.references import find_references, read_reference, reference_path, write_reference
from lm_eval_toolfid.integrations.lm_eval.settings import TaskSettings

from .conftest import make_case

KEY = RunKey(base={"pretrained": "b", "backend": "hf"}, case_set="cs", prompt="p", generation={"max_gen_toks": 8})


def _writer(directory: str, tag: str, rounds: int) -> None:
    from pathlib import Path

    for i in range(rounds):
        cases = {f"c{j}": f"{tag}-{i}-" + "x" * 2000 for j in range(40)}
        write_reference(KEY, {c: "h" for c in cases}, cases, Path(directory))


def test_two_processes_writing_the_same_reference_leave_one_valid_file(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), tag, 30)) for tag in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    files = list(tmp_path.iterdir())
    assert files == [reference_path(KEY, tmp_path)]  # no temp file left behind
    ref = read_reference(files[0])
    tags = {g.split("-")[0] for g in ref.generations.values()}
    assert len(ref.generations) == 40 and len(tags) == 1  # one writer's whole file, never a mix


def test_atomic_write_leaves_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    target = tmp_path / "f.json"
    atomic_write_text(target, "old")
    import os

    def broken_replace(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        atomic_write_text(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.json"]


@pytest.mark.parametrize("content, what", [
    ("{not json", "cannot read base reference"),
    ('{"format": "something-else"}', "not a toolfid base reference"),
    ('{"format": "toolfid-reference/2", "key": {}, "cases": {"a": {"generation": 1}}}', "corrupt base reference"),
    ('{"format": "toolfid-reference/2", "key": {}, "cases": []}', "corrupt base reference"),
])
def test_a_corrupt_reference_is_one_line_and_never_used(tmp_path, content, what, caplog):
    path = reference_path(KEY, tmp_path)
    path.write_text(content)
    with pytest.raises(ToolfidError, match=what) as err:
        read_reference(path)
    assert "\n" not in str(err.value) and "re-run the base" in str(err.value)
    assert find_references(KEY, tmp_path) == []  # skipped with a warning
    assert what in caplog.text


def _base_run(monkeypatch, tmp_path, rank: str) -> FidelityRun:
    monkeypatch.setenv("RANK", rank)
    case = make_case()
    settings = TaskSettings.from_metadata({"pretrained": "b", "reference_dir": str(tmp_path / "refs")})
    run = FidelityRun(settings, {case.id: case})
    run.resolve(KEY, {case.id: "h"})
    run.finish([run.score(case.id, '{"name": "get_weather", "arguments": {"city": "Paris"}}')])
    return run


def test_only_rank_zero_writes_references(tmp_path, monkeypatch):
    run = _base_run(monkeypatch, tmp_path, "1")
    assert run.provenance["reference_not_written"] == "not rank 0" and not (tmp_path / "refs").exists()
    run = _base_run(monkeypatch, tmp_path, "0")
    assert json.loads(open(run.provenance["reference_written"]).read())["cases"]["c1"]["prompt_hash"] == "h"


def test_finish_runs_once(tmp_path, monkeypatch):
    run = _base_run(monkeypatch, tmp_path, "0")
    first = run.finish([])
    assert run.finish([]) is first and first.summary.n == 1  # the first call's records, not the second's


def test_an_adapter_looking_key_refuses_to_write_a_reference(tmp_path):
    case = make_case()
    settings = TaskSettings.from_metadata({"pretrained": "b", "my_lora_weights": "/x",
                                           "reference_dir": str(tmp_path / "refs")})
    assert not settings.is_adapter_run
    run = FidelityRun(settings, {case.id: case})
    run.resolve(KEY, {case.id: "h"})
    run.finish([run.score(case.id, "prose")])
    assert "my_lora_weights" in run.provenance["reference_not_written"] and not (tmp_path / "refs").exists()


def test_exclusive_makes_two_preparers_take_turns(tmp_path):
    """Two workers preparing one cached folder: the second waits, then finds it made (prepare_* and the
    test LoRAs rely on this under pytest-xdist)."""
    import threading
    import time

    from lm_eval_toolfid.core.fsutil import exclusive

    events: list[str] = []

    def worker(name: str) -> None:
        with exclusive(tmp_path / ".folder.lock"):
            events.append(f"{name} in")
            time.sleep(0.2)
            events.append(f"{name} out")

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(events) == 4 and events[0][0] == events[1][0] and events[2][0] == events[3][0], events
