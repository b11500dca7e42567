#!/usr/bin/env python
"""Benchmark: ``toolfid run`` (base + every fixture adapter, one process) vs one ``lm_eval`` process per view.

On the bundled fixture model and its adapters (faithful, hallucinating, broken, prose_after_results), both
sides starting from an empty reference store and including process start-up:

- one process: ``toolfid run --base B --adapter A1 --adapter A2 --adapter A3 --task fixture``
- naive: ``lm_eval ... pretrained=B`` then ``lm_eval ... pretrained=B,peft=Ai`` for each adapter.

Prints both wall times, their ratio, and whether the per-adapter json_valid_rate and
validity_delta agree between the two ways.

Usage: ``nice -n 10 .venv/bin/python bench/bench_run_vs_lm_eval.py``
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
TASK = "tool_use_fidelity_fixture"


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def metrics_of(results_file: Path) -> dict[str, float]:
    res = json.loads(results_file.read_text())["results"][TASK]
    return {k.split(",")[0]: v for k, v in res.items() if "," in k and "stderr" not in k}


def main() -> None:
    from lm_eval_toolfid.cases.bundled import fixture_paths, tasks_path

    fix = fixture_paths()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        adapter_args = [a for name, path in fix["adapters"].items() for a in ("--adapter", f"{name}={path}")]
        one, _ = run([str(BIN / "toolfid"), "run", "--base", fix["base"], *adapter_args, "--task", TASK,
                      "--output", str(tmp_path / "one"), "--json"], dict(env, TOOLFID_HOME=str(tmp_path / "h1")))
        env_naive = dict(env, TOOLFID_HOME=str(tmp_path / "h2"))
        common = ["--tasks", TASK, "--include_path", str(tasks_path()), "--model", "hf", "--batch_size", "16",
                  "--device", "cpu"]
        naive, _ = run([str(BIN / "lm_eval"), *common, "--model_args", f"pretrained={fix['base']}",
                        "--output_path", str(tmp_path / "naive" / "base")], env_naive)
        agree = True
        for name, path in fix["adapters"].items():
            t, _ = run([str(BIN / "lm_eval"), *common, "--model_args", f"pretrained={fix['base']},peft={path}",
                        "--output_path", str(tmp_path / "naive" / name)], env_naive)
            naive += t
            a = metrics_of(tmp_path / "one" / name / "results.json")
            b = metrics_of(sorted((tmp_path / "naive" / name).rglob("results_*.json"))[-1])
            agree &= all(a[k] == b[k] for k in ("json_valid_rate", "validity_delta"))
    print(f"fixture model, base + {len(fix['adapters'])} adapters, task {TASK}")
    print(f"  toolfid run (one process):     {one:7.1f} s")
    print(f"  lm_eval x {len(fix['adapters']) + 1} processes:          {naive:7.1f} s")
    print(f"  ratio one/naive:               {one / naive:7.3f}")
    print(f"  json_valid_rate and validity_delta identical both ways: {agree}")


if __name__ == "__main__":
    main()
