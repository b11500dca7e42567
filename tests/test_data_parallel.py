"""``toolfid run`` data parallel under the real ``torchrun`` (two gloo ranks on the CPU, the fixture model): the
same report, verdicts, exit code and byte-identical samples files as one process; a rank that cannot reach the others
is exit 6 in one line, not a hang; served and vLLM runs refuse a launcher's ranks in one line (exit 4)."""

from __future__ import annotations

import json
import os
import re
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
    """Five cases dealt to two ranks by prompt length (one rank three, the other two, so lm-eval pads the shorter
    share with its last request again): the conversation and the irrelevance case on different ranks
    (:func:`_dealt` checks it): the multi-turn rates were a KeyError in lm-eval's merge before, and the false-call
    rates, emitted by the other rank only, silently dropped."""
    rows = [json.loads(line) for line in Path(FIX["cases"]).read_text().splitlines() if line.strip()]
    conversation = next(r for r in rows if r.get("history"))
    irrelevant = {**rows[1], "id": "irrelevant-1", "gold_tool_name": None}
    irrelevant.pop("gold_arguments", None)
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (conversation, irrelevant, rows[0], rows[2], rows[3])))
    return path


def _dealt(samples: Path) -> list[set[str]]:
    """The case ids each of two ranks takes (the deal by prompt length, from the prompts a run sent)."""
    from lm_eval_toolfid.integrations.lm_eval.data_parallel import deal

    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    lengths = [len(r["arguments"]["gen_args_0"]["arg_0"]) for r in rows]
    return [{rows[i]["doc"]["id"] for i in deal(lengths, rank, 2)} for rank in range(2)]


def _torchrun(tmp_path: Path, args: list[str], home: str, **extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TOOLFID_HOME=str(tmp_path / home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", **extra)
    return subprocess.run([str(BIN / "torchrun"), "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend",
                           "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--monitor-interval", "0.5",
                           "--no-python", str(BIN / "toolfid"), *args], capture_output=True, text=True, env=env,
                          timeout=600)


_DIE_AFTER_FIRST_SHARD = """
import os
if os.environ.get("RANK") == "1":  # rank 1 dies as soon as its first engine run's answers are on disk
    from lm_eval_toolfid.run import shards

    _keep = shards.ShardStore.keep

    def _keep_then_die(self, answers):
        _keep(self, answers)
        os._exit(17)

    shards.ShardStore.keep = _keep_then_die
"""


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
    shares = _dealt(tmp_path / "one" / "base" / "samples.jsonl")
    conversation = next(r["id"] for r in map(json.loads, cases.read_text().splitlines()) if r.get("history"))
    assert sorted(map(len, shares)) == [2, 3] and any(conversation in a and "irrelevant-1" in b
                                                      for a, b in (shares, shares[::-1])), shares
    two = _torchrun(tmp_path, _run_args(tmp_path / "two", cases), "home-two")
    assert one.returncode == 1 and two.returncode == 1, (one.stderr[-1500:], two.stderr[-3000:])  # broken FAILs
    assert two.stdout.strip() and one.stdout.strip(), (one.stdout[:300], two.stdout[:300], two.stderr[-3000:])
    ours, theirs = json.loads(two.stdout), json.loads(one.stdout)  # rank 0 alone prints the report
    metrics = theirs["adapters"]["broken"]["metrics"]
    assert metrics.get("result_grounding_rate") is not None and "false_call_rate" in metrics, metrics  # both there
    assert ours["base"] == theirs["base"]
    _as_one_process(tmp_path / "two", ours, tmp_path / "one", theirs)
    assert not (tmp_path / "two" / "shards").exists()  # every view saved: the ranks' shards removed
    assert "3 cases a rank on 2 ranks" in two.stderr and "[1/3] base: 5 cases" in two.stderr, two.stderr[-2000:]
    assert two.stderr.count("[1/3] base") == 1  # one progress display: rank 0's
    # the folder two ranks wrote is one process's: --resume without a launcher reuses every view, loads nothing
    again = toolfid_here([*_run_args(tmp_path / "two", cases), "--resume"], tmp_path / "home-two")
    assert again.returncode == 1 and again.stderr.count("reusing") == 3, again.stderr[-2000:]
    assert "computed again" not in again.stderr and "loading" not in again.stderr

    # a rank that dies leaves its finished answers on disk; one process's --resume answers from them, computes the
    # rest, and gives the uninterrupted run's files
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_DIE_AFTER_FIRST_SHARD)
    died = _torchrun(tmp_path, _run_args(tmp_path / "died", cases), "home-died",
                     PYTHONPATH=os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]))
    # torchrun's own exit code when a rank fails (1, as its ChildFailedError says); no report printed
    assert died.returncode != 0 and not died.stdout.strip() and "exitcode  : 17" in died.stderr, died.stderr[-3000:]
    left = sorted(p.name for p in (tmp_path / "died" / "shards").glob("rank*.json"))
    assert any(name.startswith("rank1-") for name in left), (left, died.stderr[-3000:])
    assert not (tmp_path / "died" / "base" / "manifest.json").exists()  # no view was saved
    resumed = toolfid_here([*_run_args(tmp_path / "died", cases), "--resume"], tmp_path / "home-died")
    assert resumed.returncode == 1, resumed.stderr[-3000:]
    # float32: the adapter views verify the base's answers, so the first engine run is the base view's alone
    reused = re.search(r"--resume: (\d+) answers of 1 view\(s\) from the ranks' shards", resumed.stderr)
    assert reused and int(reused.group(1)) >= 2, resumed.stderr[-3000:]  # at least rank 1's share
    if int(reused.group(1)) == 5:  # no base token generated here: no tokens-per-second made of read-back answers
        line = next(x for x in resumed.stderr.splitlines() if "] base: 5 cases" in x)
        assert "tok/s" not in line, line
    _as_one_process(tmp_path / "died", json.loads(resumed.stdout), tmp_path / "one", theirs)
    assert not (tmp_path / "died" / "shards").exists()


def _as_one_process(out: Path, report: dict, one: Path, theirs: dict) -> None:
    """A run's folder and report are one process's: every adapter's metrics and verdict, every view's samples byte for
    byte, and each view's generation record counting every case (every rank's rows)."""
    for label in ("broken", "faithful"):
        assert report["adapters"][label]["metrics"] == theirs["adapters"][label]["metrics"], label
        assert report["adapters"][label]["verdict"] == theirs["adapters"][label]["verdict"], label
    counted = ("rows", "tokens", "tokens_decoded", "tokens_accepted", "rows_verified", "prompt_tokens")
    for view in ("base", "broken", "faithful"):
        assert (out / view / "samples.jsonl").read_bytes() == (one / view / "samples.jsonl").read_bytes(), view
        mine, whole = _generation(out, view), _generation(one, view)
        assert {k: mine.get(k) for k in counted} == {k: whole.get(k) for k in counted}, (view, mine, whole)
        assert mine["rows"] == 5


def _generation(out: Path, view: str) -> dict:
    results = json.loads((out / view / "results.json").read_text())
    return results["configs"][FIXTURE_TASK]["metadata"]["toolfid"]["generation"]


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


@pytest.mark.slow
def test_in_bfloat16_a_b_zero_adapter_is_the_base_bit_for_bit_under_two_ranks(tmp_path: Path) -> None:
    """bfloat16, two ranks: every view decodes in the same engine run (half precision decodes), and a B = 0 adapter's
    answers are the base's, case by case, on both ranks' shares."""
    from .lora_recipes import zero_lora

    zero = zero_lora(Path(FIX["base"]), tmp_path / "zero")
    args = ["run", "--base", FIX["base"], "--adapter", f"zero={zero}", "--adapter", f"broken={FIX['adapters']['broken']}",
            "--task", FIXTURE_TASK, "--device", "cpu", "--dtype", "bfloat16", "--limit", "9",
            "--output", str(tmp_path / "out"), "--json"]
    two = _torchrun(tmp_path, args, "home")
    assert two.returncode == 0, two.stderr[-3000:]

    def answers(view: str) -> dict[str, list]:
        rows = [json.loads(line) for line in (tmp_path / "out" / view / "samples.jsonl").read_text().splitlines()]
        return {r["doc"]["id"]: r["resps"] for r in rows}

    base, zeroed, broken = answers("base"), answers("zero"), answers("broken")
    assert len(base) == 9 and zeroed == base and broken != base
    assert _generation(tmp_path / "out", "zero")["rows"] == 9
    assert json.loads(two.stdout)["adapters"]["zero"]["metrics"]["identical_output_rate"] == 1.0


@pytest.mark.slow
def test_a_null_calibration_under_two_ranks_is_one_process_s(tmp_path: Path) -> None:
    """``--null-runs``: the nulls are dealt and gathered as the views are; the fit, every null's answers and the z the
    adapter is judged by are one process's, byte for byte."""
    cases = _cases(tmp_path)
    args = lambda out: ["run", "--base", FIX["base"], "--adapter", f"faithful={FIX['adapters']['faithful']}",  # noqa: E731
                        "--task", FIXTURE_TASK, "--device", "cpu", "--cases", str(cases), "--null-runs", "1",
                        "--output", str(out), "--json"]
    one = toolfid_here(args(tmp_path / "one"), tmp_path / "home-one")
    two = _torchrun(tmp_path, args(tmp_path / "two"), "home-two")
    assert one.returncode == two.returncode and one.returncode in (0, 1, 2), (one.stderr[-2000:], two.stderr[-3000:])
    made = sorted(r for r in (p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*") if p.is_file())
                  if ("null" in str(r) or "calibration" in r.name) and r.suffix in (".json", ".jsonl"))
    assert any(p.name == "calibration.json" for p in made) and sum(p.suffix == ".jsonl" for p in made) == 3, made
    for path in made:
        assert (tmp_path / "two" / path).read_bytes() == (tmp_path / "one" / path).read_bytes(), path
    ours, theirs = json.loads(two.stdout)["adapters"]["faithful"], json.loads(one.stdout)["adapters"]["faithful"]
    assert ours["metrics"] == theirs["metrics"] and ours["verdict"] == theirs["verdict"]
    assert ours["metrics"].get("json_valid_z") is not None
