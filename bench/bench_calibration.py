#!/usr/bin/env python
"""Benchmark: null calibration in one process vs the naive way (one lm_eval process per null).

Both sides start from nothing (fresh reference store) and include process start-up:

- one process: ``toolfid calibrate --base B --adapter A --runs K --multipliers 1`` — loads the base
  once, runs the base view, swaps each null adapter's weights in place, fits;
- naive: ``lm_eval ... pretrained=B`` once (the base reference), then ``lm_eval ...
  pretrained=B,peft=null_XX`` for each of the K nulls, each process loading the model again.

Prints both wall times and their ratio (target ≤ 0.35 on the fixture model). Usage::

    .venv/bin/python bench/bench_calibration.py [--runs 8] [--base DIR --adapter DIR --task TASK]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def run(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    from lm_eval_toolfid.cases.bundled import fixture_paths, tasks_path

    fix = fixture_paths()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--base", default=fix["base"])
    parser.add_argument("--adapter", default=fix["adapters"]["faithful"])
    parser.add_argument("--task", default="tool_use_fidelity_fixture")
    parser.add_argument("--batch-size", default="16")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")

        env_one = dict(env, TOOLFID_HOME=str(tmp_path / "home-one"))
        one = run([str(BIN / "toolfid"), "calibrate", "--base", args.base, "--adapter", args.adapter,
                   "--runs", str(args.runs), "--multipliers", "1", "--task", args.task,
                   "--batch-size", args.batch_size, "--out", str(tmp_path / "one" / "calib.json")], env_one)

        nulls = tmp_path / "one" / "null_adapters"
        env_naive = dict(env, TOOLFID_HOME=str(tmp_path / "home-naive"))
        common = ["--tasks", args.task, "--include_path", str(tasks_path()), "--model", "hf",
                  "--batch_size", args.batch_size, "--device", "cpu"]
        naive = run([str(BIN / "lm_eval"), *common, "--model_args", f"pretrained={args.base}",
                     "--output_path", str(tmp_path / "naive" / "base")], env_naive)
        for null in sorted(nulls.iterdir()):
            naive += run([str(BIN / "lm_eval"), *common, "--model_args", f"pretrained={args.base},peft={null}",
                          "--output_path", str(tmp_path / "naive" / null.name)], env_naive)
        post = run([str(BIN / "toolfid"), "calibrate", "--from-results", str(tmp_path / "naive"), "--task",
                    args.task, "--out", str(tmp_path / "naive" / "calib.json")], env_naive)
        naive += post
        same = json.loads((tmp_path / "one" / "calib.json").read_text())["fits"] == \
            json.loads((tmp_path / "naive" / "calib.json").read_text())["fits"]

    print(f"null calibration, K={args.runs} null adapters, task {args.task}")
    print(f"  one process (toolfid calibrate):        {one:7.1f} s")
    print(f"  naive ({args.runs + 1} lm_eval processes + fit):     {naive:7.1f} s")
    print(f"  ratio one/naive:                        {one / naive:7.3f}  (target <= 0.35)")
    print(f"  both fits identical:                    {same}")


if __name__ == "__main__":
    main()
