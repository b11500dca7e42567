"""``toolfid run`` data parallel under the real ``torchrun`` (two gloo ranks on the CPU, the fixture model): the
same report, verdicts, exit code and byte-identical samples files as one process; a rank that cannot reach the others
is exit 6 in one line, not a hang; served and vLLM runs refuse a launcher's ranks in one line (exit 4)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths

from .lm_eval_helpers import FIXTURE_TASK, toolfid_here

FIX = fixture_paths()
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cases(tmp_path: Path) -> Path:
    """Five cases dealt to two ranks (rank 0: three, rank 1: two, so lm-eval pads rank 1 with its last request
    again): a conversation on rank 0 only (its multi-turn rates: a KeyError in lm-eval's merge before) and an
    irrelevance case on rank 1 only (its false-call rates: silently dropped before, rank 0's accumulator not having
    them)."""
    rows = [json.loads(line) for line in Path(FIX["cases"]).read_text().splitlines() if line.strip()]
    conversation = next(r for r in rows if r.get("history"))
    irrelevant = {**rows[1], "id": "irrelevant-1", "gold_tool_name": None}
    irrelevant.pop("gold_arguments", None)
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (conversation, irrelevant, rows[0], rows[2], rows[3])))
    return path


def _run_args(out: Path, cases: Path | None = None) -> list[str]:
    return ["run", "--base", FIX["base"], "--adapter", f"broken={FIX['adapters']['broken']}", "--adapter",
            f"faithful={FIX['adapters']['faithful']}", "--task", FIXTURE_TASK, "--device", "cpu",
            *(["--cases", str(cases)] if cases else ["--limit", "15"]), "--output", str(out), "--json", "--gate"]


@pytest.mark.slow
def test_two_ranks_give_one_process_s_report_samples_and_exit_code(tmp_path: Path) -> None:
    """The report (every metric, every verdict), the ``--gate`` exit code and the samples files byte for byte are
    one process's; the folder is then one process's to ``--resume``."""
    cases = _cases(tmp_path)
    one = toolfid_here(_run_args(tmp_path / "one", cases), tmp_path / "home-one")
    env = dict(os.environ, TOOLFID_HOME=str(tmp_path / "home-two"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false")
    two = subprocess.run([str(BIN / "torchrun"), "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend",
                          "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--no-python", str(BIN / "toolfid"),
                          *_run_args(tmp_path / "two", cases)], capture_output=True, text=True, env=env, timeout=600)
    assert one.returncode == 1 and two.returncode == 1, (one.stderr[-1500:], two.stderr[-3000:])  # broken FAILs
    assert two.stdout.strip() and one.stdout.strip(), (one.stdout[:300], two.stdout[:300], two.stderr[-3000:])
    ours, theirs = json.loads(two.stdout), json.loads(one.stdout)  # rank 0 alone prints the report
    metrics = theirs["adapters"]["broken"]["metrics"]
    assert metrics.get("result_grounding_rate") is not None and "false_call_rate" in metrics, metrics  # both there
    assert ours["base"] == theirs["base"]
    for label in ("broken", "faithful"):
        assert ours["adapters"][label]["metrics"] == theirs["adapters"][label]["metrics"], label
        assert ours["adapters"][label]["verdict"] == theirs["adapters"][label]["verdict"], label
    for view in ("base", "broken", "faithful"):
        assert (tmp_path / "two" / view / "samples.jsonl").read_bytes() == \
            (tmp_path / "one" / view / "samples.jsonl").read_bytes(), view
    assert "3 cases a rank on 2 ranks" in two.stderr and "[1/3] base: 5 cases" in two.stderr, two.stderr[-2000:]
    assert two.stderr.count("[1/3] base") == 1  # one progress display: rank 0's
    # the folder two ranks wrote is one process's: --resume without a launcher reuses every view, loads nothing
    again = toolfid_here([*_run_args(tmp_path / "two", cases), "--resume"], tmp_path / "home-two")
    assert again.returncode == 1 and again.stderr.count("reusing") == 3, again.stderr[-2000:]
    assert "computed again" not in again.stderr and "loading" not in again.stderr


def test_a_rank_that_cannot_reach_the_others_is_exit_6_in_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), TOOLFID_RANK_TIMEOUT="2", TOOLFID_HOME=str(tmp_path / "home"))
    proc = subprocess.run([str(BIN / "toolfid"), *_run_args(tmp_path / "out")], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 6, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "could not join the others" in proc.stderr
    assert not (tmp_path / "out" / "base").exists()


def test_served_and_vllm_runs_refuse_a_launchers_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    for models in (["--server", "http://127.0.0.1:9"], ["--backend", "vllm"]):
        proc = toolfid_here(["run", "--base", "b", "--adapter", "a=x", *models, "--output", tmp_path / "out"],
                            tmp_path / "home")
        assert proc.returncode == 4 and "scale with the server's or vLLM's own parallelism" in proc.stderr, \
            proc.stderr
