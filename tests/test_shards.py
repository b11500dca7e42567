"""The pieces of a launcher's run that need no launcher: the deal of the cases by prompt length, the ranks' rows
gathered with the metric values, and the shards a rank leaves on disk (what ``--resume`` takes from them, and what it
refuses)."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from lm_eval_toolfid.integrations.lm_eval import data_parallel as dp
from lm_eval_toolfid.integrations.lm_eval.generation_record import GenerationInfo
from lm_eval_toolfid.run import shards


@pytest.mark.parametrize("world", [2, 3, 8])
def test_the_deal_takes_every_case_once_and_spreads_the_long_prompts(world: int) -> None:
    rng = random.Random(world)
    # a case file where every W-th case is a long conversation: round robin gives them all to rank 0
    lengths = [rng.randint(2000, 4000) if i % world == 0 else rng.randint(200, 400) for i in range(10 * world + 1)]
    shares = [dp.deal(lengths, rank, world) for rank in range(world)]
    assert sorted(i for share in shares for i in share) == list(range(len(lengths)))
    assert all(share == sorted(share) for share in shares)  # each rank's cases in document order
    assert {len(share) for share in shares} <= {len(lengths) // world, -(-len(lengths) // world)}
    totals = [sum(lengths[i] for i in share) for share in shares]
    assert max(totals) - min(totals) <= max(lengths)  # within one prompt of each other
    robin = [sum(lengths[rank::world]) for rank in range(world)]
    assert max(totals) / min(totals) < 1.2 < max(robin) / min(robin)


def test_one_rank_takes_everything_in_order() -> None:
    assert dp.deal([3, 9, 1], 0, 1) == [0, 1, 2]


def test_every_rank_s_rows_reach_rank_0_in_case_order() -> None:
    dp.start("t")
    parts = []
    for rank, positions in ((0, [0, 2, 4]), (1, [1, 3])):
        dp.start("t")  # each rank's process records its own cases
        for p in positions:
            dp.emitted("t", p, ["m"])
        dp.rows_from("t", lambda positions=positions, rank=rank: [(p, f"info{p}", f"c{p}", "a", None)
                                                                   for p in positions])
        parts.append(dp.with_positions({"t": {("m", "none"): [float(p) for p in positions]}}))
    merged = dp.merge_metrics(parts)
    assert merged[0]["t"][("m", "none")] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [row[0] for row in dp.gathered_rows("t")] == [0, 1, 2, 3, 4]
    dp.start("t")  # the next view starts afresh
    assert dp.gathered_rows("t") is None


def _answers(label: str = "base") -> dict:
    info = GenerationInfo(engine="toolfid", tokens=3, decoded=2, views_together=("base", "a"))
    return {label: {"prompt one": ((12, ["\n"], True, "", False, None), [5, 6, 7], info, None),
                    "prompt two": ((12, ["\n"], True, "", False, None), [8], info, "run on")}}


def test_a_rank_s_answers_come_back_for_the_same_view_and_settings_only(tmp_path: Path) -> None:
    digests = {"base": shards.manifest_digest({"base": "B"}), "a": shards.manifest_digest({"adapter": "A"})}
    writer = shards.ShardStore(tmp_path, digests, rank=1, world=2)
    writer.keep(_answers())
    (written,) = (tmp_path / "shards").glob("rank1-*.json")
    assert json.loads(written.read_text())["views"]["base"]["manifest"] == digests["base"]

    reader = shards.ShardStore(tmp_path, digests, resume=True, write=False)
    key = (12, ["\n"], True, "", False, None)
    one, two, missing = reader.lookup("base", ["prompt one", "prompt two", "prompt three"], [key, key, key])
    assert one.tokens == [5, 6, 7] and one.check_text is None and missing is None
    assert two.check_text == "run on" and two.info == _answers()["base"]["prompt one"][2]
    assert reader.lookup("base", ["prompt one"], [(13, ["\n"], True, "", False, None)]) == [None]  # another budget
    assert reader.lookup("a", ["prompt one"], [key]) == [None]  # another view
    # the view's inputs changed since (its manifest): nothing is reused
    changed = shards.ShardStore(tmp_path, {"base": shards.manifest_digest({"base": "B2"})}, resume=True)
    assert changed.lookup("base", ["prompt one"], [key]) == [None]
    # without --resume nothing is read; a process that only reads writes nothing
    assert shards.ShardStore(tmp_path, digests).lookup("base", ["prompt one"], [key]) == [None]
    reader.keep(_answers())
    assert len(list((tmp_path / "shards").glob("*.json"))) == 1
    reader.remove()
    assert not (tmp_path / "shards").exists()


def test_a_shard_cut_short_is_left_out_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    digests = {"base": shards.manifest_digest({"base": "B"})}
    shards.ShardStore(tmp_path, digests).keep(_answers())
    (good,) = (tmp_path / "shards").glob("*.json")
    (tmp_path / "shards" / "rank1-9.json").write_text(good.read_text()[:40])
    with caplog.at_level(logging.WARNING, logger="lm_eval.toolfid"):
        found = shards.ShardStore(tmp_path, digests, resume=True).lookup("base", ["prompt one"],
                                                                         [(12, ["\n"], True, "", False, None)])
    assert found[0] is not None and found[0].tokens == [5, 6, 7]
    assert [r.getMessage() for r in caplog.records if "left out" in r.getMessage()] == [
        f"toolfid: --resume: 1 shard file(s) in {tmp_path / 'shards'} left out (not written completely by this run: "
        "rank1-9.json); their answers are computed again"]
    shards.clear(tmp_path)
    assert not (tmp_path / "shards").exists()

