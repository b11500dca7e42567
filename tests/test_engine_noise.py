"""OUT/engine_check.json: what write_check writes, read_check reads back for --resume and the report."""

from __future__ import annotations

from pathlib import Path

from lm_eval_toolfid.scoring import engine_noise


def test_a_check_saved_with_engine_args_is_read_back_for_the_same_run(tmp_path: Path) -> None:
    """A vLLM run's manifest holds engine args as tuples and paths; the file holds their JSON. The same run must
    find its check again (--resume reuses it), another base run or other settings must not."""
    path = tmp_path / engine_noise.FILE
    texts = {"a": "x", "b": "y"}
    manifest = {"backend": "vllm", "engine_args": (("max_model_len", 4096), ("enforce_eager", True)),
                "pretrained": tmp_path / "base"}
    check = engine_noise.compare_runs(texts, {"a": "x", "b": "z"})
    engine_noise.write_check(path, check, texts, manifest)
    again = engine_noise.read_check(path, texts, manifest)
    assert again is not None and (again.n, again.identical, again.changed) == (2, 1, check.changed)
    assert engine_noise.read_check(path, texts) is not None  # the report: any manifest
    assert engine_noise.read_check(path, {"a": "x", "b": "other"}, manifest) is None  # another base run
    assert engine_noise.read_check(path, texts, {**manifest, "engine_args": (("max_model_len", 2048),)}) is None
    assert engine_noise.read_check(tmp_path / "absent.json", texts, manifest) is None


def test_the_printed_engine_checks_of_docs_served_md_are_what_a_run_prints(capsys) -> None:
    """docs/served.md's two engine-check blocks (a served run and a vLLM run, measured there) are printed again by
    the run's own printer from the same counts, and compared line by line (tests/doc_output.py)."""
    from lm_eval_toolfid.reporting.run_report import print_engine_check

    from .doc_output import REPO, mismatches, printed_blocks

    runs = {"toolfid run --engine-check, 2 of 4 cases moved": (("c003", "c011"), "ad", 1, 1),
            "toolfid run --engine-check, 1 of 4 cases moved": (("travel-0002",), "prose", 4, 1)}
    blocks = [b for b in printed_blocks(REPO / "docs" / "served.md") if b.source in runs]
    assert len(blocks) == 2
    for block in blocks:
        moved_cases, label, changed, moved = runs[block.source]
        check = engine_noise.EngineCheck(n=4, identical=4 - len(moved_cases), changed=moved_cases)
        print_engine_check(check, {label: {"note": engine_noise.adapter_note(check, changed, moved)}})
        assert mismatches(block, capsys.readouterr().out) == [], block.where()
