"""Helpers for tests that drive the real lm_eval CLI on the bundled fixture model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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



_DEFAULT_INDEX: dict = {}


def lm_eval_index_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Index lm-eval's own bundled task folder once per test process, not once per in-process ``lm_eval`` call
    (tests/conftest.py applies it to every test process).

    ``lm_eval``'s CLI builds a ``TaskManager`` that walks every YAML file lm-eval ships (thousands: 5-15 s on a loaded
    core) before the first case. That folder is part of the installed package and cannot change during a test run,
    so its index is computed once (by lm-eval's own ``TaskIndex.build``) and handed out again; every other folder (the
    project's task folder given as ``--include_path``, a test's own) is still indexed on every call. The tests that run
    the real ``lm_eval`` console script in a subprocess still pay the whole indexing: they check it end to end.
    """
    from lm_eval.tasks import _index, manager

    bundled = Path(manager.__file__).resolve().parent
    build = _index.TaskIndex.build

    def once(paths, *, resolve_includes=True):  # noqa: ANN001, ANN202 - lm-eval's own signature
        index: dict = {}
        for root in paths:
            if Path(root).resolve() == bundled:
                key = (str(bundled), resolve_includes)
                if key not in _DEFAULT_INDEX:
                    _DEFAULT_INDEX[key] = build([root], resolve_includes=resolve_includes)
                part = _DEFAULT_INDEX[key]
            else:
                part = build([root], resolve_includes=resolve_includes)
            index.update(part)  # a later path overrides an earlier one, as in lm-eval's build
        return index

    monkeypatch.setattr(_index.TaskIndex, "build", staticmethod(once))


def lm_eval_in_process(model_args: str, out: Path, home: Path, metadata: dict | None = None,
                       task: str = FIXTURE_TASK, extra: list[str] | None = None) -> tuple[int, str]:
    """The same run as :func:`lm_eval_cli`, through ``toolfid lm-eval`` in this process (lm-eval's own CLI code,
    without a new interpreter's imports; with the ``lm_eval_index_once`` fixture, without indexing lm-eval's tasks
    again): the exit code and what was printed to stderr. For tests about what a run writes, not about the console
    script (the tests that check the console script and its stderr keep :func:`lm_eval_cli`)."""
    import io
    from contextlib import redirect_stderr

    from lm_eval_toolfid.cli import main

    argv = ["lm-eval", "--tasks", task, "--model", "hf", "--model_args", model_args, "--output_path", str(out),
            "--log_samples", "--batch_size", "16", "--device", "cpu"]
    if metadata:
        argv += ["--metadata", json.dumps(metadata)]
    argv += extra or []
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOOLFID_HOME", str(home))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TOKENIZERS_PARALLELISM", "false")
        mp.setattr(sys, "argv", list(sys.argv))  # toolfid lm-eval sets sys.argv for lm-eval's parser
        with redirect_stderr(err):
            code = main(argv)
    return code, err.getvalue()
