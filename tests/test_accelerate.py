"""Data-parallel ``lm_eval`` under ``accelerate launch`` with 2 CPU processes on the fixture model.

``accelerate launch --cpu --num_processes 2`` starts ONE process on CPU (accelerate's simple
launcher; no RANK/WORLD_SIZE set); two ranks on CPU need ``--multi_gpu --num_processes 2``
(torchrun under the hood; gloo on CPU), which sets RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT in every rank. This test checks both facts
and that a tiny 2-rank lm_eval run of the task completes and writes its results.

The two ranks run lm-eval's own CLI (``lm_eval.__main__.cli_evaluate``: its parser, evaluator and ``--model hf``)
through a launcher script, as ``accelerate launch -m lm_eval`` does, with two differences that are not what this
module tests: each rank records its environment (so the 2-rank run also gives the ``--multi_gpu`` facts: one
torchrun launch, not two), and each rank indexes only the task folder it is given (``--include_path``), not the
thousands of YAML files lm-eval ships (about 10 s of CPU per rank, twice; the task asked for is ours). The console
script with its whole index runs in tests/test_lm_eval_cli.py and tests/test_wheel.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths, tasks_path

from .lm_eval_helpers import FIXTURE_TASK, metrics

pytestmark = pytest.mark.slow
ACCELERATE = str(Path(sys.executable).parent / "accelerate")
ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ, TOOLFID_HOME=str(home), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    env.pop("LOCAL_RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


RANK_LAUNCHER = """\
import json, os, sys
from pathlib import Path

# this rank's environment, to its own file (two ranks share one stdout, and their lines can interleave)
values = {k: os.environ.get(k) for k in %(keys)r}
Path(sys.argv[1], f"{os.getpid()}.json").write_text(json.dumps(values))
if len(sys.argv) > 2:  # then lm-eval's own CLI, indexing only the task folders it is given (module docstring)
    from lm_eval.tasks import _index, manager

    bundled = Path(manager.__file__).resolve().parent
    build = _index.TaskIndex.build
    _index.TaskIndex.build = staticmethod(
        lambda paths, **kw: build([p for p in paths if Path(p).resolve() != bundled], **kw))
    sys.argv = ["lm_eval", *sys.argv[2:]]
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
"""


def _launch(tmp_path: Path, flag: str, port: int, lm_eval_args: list[str] = (), home: Path | None = None,
            timeout: int = 300) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """``accelerate launch FLAG --num_processes 2`` of the rank launcher: the run, and each process's rank
    variables."""
    outdir = tmp_path / f"env{flag.replace('-', '_')}"
    outdir.mkdir()
    script = tmp_path / "ranks.py"
    script.write_text(RANK_LAUNCHER % {"keys": ENV_KEYS})
    proc = subprocess.run([ACCELERATE, "launch", flag, "--num_processes", "2", "--main_process_port", str(port),
                           str(script), str(outdir), *lm_eval_args], capture_output=True, text=True,
                          env=_env(home or tmp_path), timeout=timeout)
    return proc, [json.loads(p.read_text()) for p in sorted(outdir.glob("*.json"))]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess, list[dict]]:
    """ONE ``accelerate launch --multi_gpu --num_processes 2`` running lm_eval on the fixture task: each rank's
    environment and the run's files (both tests read it)."""
    tmp_path = tmp_path_factory.mktemp("ranks")
    fix = fixture_paths()
    args = ["--tasks", FIXTURE_TASK, "--include_path", str(tasks_path()), "--model", "hf",
            "--model_args", f"pretrained={fix['base']}", "--output_path", str(tmp_path / "out"), "--log_samples",
            "--batch_size", "4", "--limit", "8", "--device", "cpu"]
    proc, ranks = _launch(tmp_path, "--multi_gpu", 29532, args, home=tmp_path / "home", timeout=600)
    return tmp_path, proc, ranks


def test_rank_env_vars(tmp_path: Path, two_ranks: tuple[Path, subprocess.CompletedProcess, list[dict]]) -> None:
    proc, single = _launch(tmp_path, "--cpu", 29531)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert single == [{k: None for k in ENV_KEYS}]
    _, proc, ranks = two_ranks  # the environment of the two ranks that ran lm_eval
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(r["RANK"] for r in ranks) == ["0", "1"]
    assert sorted(r["LOCAL_RANK"] for r in ranks) == ["0", "1"]
    assert {r["WORLD_SIZE"] for r in ranks} == {"2"}


def test_two_rank_lm_eval_run_completes(two_ranks: tuple[Path, subprocess.CompletedProcess, list[dict]]) -> None:
    tmp_path, proc, ranks = two_ranks
    out = tmp_path / "out"
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(ranks) == 2  # lm_eval ran in two processes
    results_files = list(out.rglob("results_*.json"))
    assert len(results_files) == 1  # only rank 0 writes results
    results = json.loads(results_files[0].read_text())
    assert results["n-samples"][FIXTURE_TASK]["effective"] == 8
    assert 0.0 <= metrics(results)["json_valid_rate"] <= 1.0
    samples = [json.loads(line) for f in out.rglob(f"samples_{FIXTURE_TASK}_*.jsonl")
               for line in f.read_text().splitlines() if line.strip()]
    assert len(samples) == 8  # both ranks' samples gathered
    # rank 0 finishes the run from the gathered records: it alone writes the base reference, of all 8 cases
    # (a subset reference: --limit), and says so in the results (the README and docs/own-model.md say this)
    from lm_eval_toolfid.pairing.references import read_reference

    refs = sorted((tmp_path / "home" / "references").glob("*.json"))
    assert len(refs) == 1, refs
    ref = read_reference(refs[0])
    assert ref.subset and len(ref.generations) == 8
    toolfid = results["configs"][FIXTURE_TASK]["metadata"]["toolfid"]
    assert toolfid["reference_written"] == str(refs[0]) and "reference_not_written" not in toolfid
