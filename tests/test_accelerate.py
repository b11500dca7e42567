"""Data-parallel ``lm_eval`` under ``accelerate launch`` with 2 CPU processes on the fixture model.

``accelerate launch --cpu --num_processes 2`` starts ONE process on CPU (accelerate's simple
launcher; no RANK/WORLD_SIZE set); two ranks on CPU need ``--multi_gpu --num_processes 2``
(torchrun under the hood; gloo on CPU), which sets RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT in every rank. This test checks both facts
and that a tiny 2-rank lm_eval run of the task completes and writes its results.
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


def _ranks_env(tmp_path: Path, flag: str) -> list[dict]:
    """Each process writes its environment to its own file (two ranks share one stdout, and their
    lines can interleave)."""
    outdir = tmp_path / f"env{flag.replace('-', '_')}"
    outdir.mkdir()
    script = tmp_path / "env.py"
    script.write_text("import json, os, sys\n"
                      f"values = {{k: os.environ.get(k) for k in {ENV_KEYS!r}}}\n"
                      "name = f'{os.getpid()}.json'\n"
                      "open(os.path.join(sys.argv[1], name), 'w').write(json.dumps(values))\n")
    proc = subprocess.run([ACCELERATE, "launch", flag, "--num_processes", "2", "--main_process_port", "29531",
                           str(script), str(outdir)], capture_output=True, text=True, env=_env(tmp_path),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(p.read_text()) for p in sorted(outdir.glob("*.json"))]


def test_rank_env_vars(tmp_path: Path) -> None:
    single = _ranks_env(tmp_path, "--cpu")
    assert single == [{k: None for k in ENV_KEYS}]
    ranks = _ranks_env(tmp_path, "--multi_gpu")
    assert sorted(r["RANK"] for r in ranks) == ["0", "1"]
    assert sorted(r["LOCAL_RANK"] for r in ranks) == ["0", "1"]
    assert {r["WORLD_SIZE"] for r in ranks} == {"2"}


def test_two_rank_lm_eval_run_completes(tmp_path: Path) -> None:
    fix = fixture_paths()
    out = tmp_path / "out"
    cmd = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port", "29532",
           "-m", "lm_eval", "--tasks", FIXTURE_TASK, "--include_path", str(tasks_path()), "--model", "hf",
           "--model_args", f"pretrained={fix['base']}", "--output_path", str(out), "--log_samples",
           "--batch_size", "4", "--limit", "8", "--device", "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(tmp_path / "home"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
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
