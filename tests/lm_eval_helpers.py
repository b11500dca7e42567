"""Helpers for tests that drive the real lm_eval CLI on the bundled fixture model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FIXTURE_TASK = "tool_use_fidelity_fixture"
BIN = Path(sys.executable).parent


def lm_eval_cli(model_args: str, out: Path, home: Path, metadata: dict | None = None,
                task: str = FIXTURE_TASK, extra: list[str] | None = None,
                env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``lm_eval`` exactly as a user would (a subprocess, --include_path on the task folder)."""
    from lm_eval_toolfid.cases.bundled import tasks_path

    cmd = [str(BIN / "lm_eval"), "--tasks", task, "--include_path", str(tasks_path()), "--model", "hf",
           "--model_args", model_args, "--output_path", str(out), "--log_samples", "--batch_size", "16",
           "--device", "cpu"]
    if metadata:
        cmd += ["--metadata", json.dumps(metadata)]
    cmd += extra or []
    full_env = dict(os.environ, TOOLFID_HOME=str(home), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                    **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=900)


def read_run(out: Path, task: str = FIXTURE_TASK) -> tuple[dict, list[dict]]:
    """The results dict and samples of the newest run under ``out``."""
    results_file = sorted(out.rglob("results_*.json"))[-1]
    samples_file = sorted(out.rglob(f"samples_{task}_*.jsonl"))[-1]
    results = json.loads(results_file.read_text())
    samples = [json.loads(line) for line in samples_file.read_text().splitlines() if line.strip()]
    return results, samples


def metrics(results: dict, task: str = FIXTURE_TASK) -> dict[str, float]:
    return {k.split(",")[0]: v for k, v in results["results"][task].items() if "," in k and "_stderr" not in k}


def toolfid_meta(results: dict, task: str = FIXTURE_TASK) -> dict:
    return results["configs"][task]["metadata"].get("toolfid", {})
