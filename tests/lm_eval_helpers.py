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


def lm_eval_here(model_args: str, out: Path, home: Path, metadata: dict | None = None,
                 task: str = FIXTURE_TASK, extra: list[str] | None = None,
                 env: dict | None = None, include_path: str | None = None,
                 cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The run :func:`lm_eval_cli` makes, with the same arguments, through lm-eval's own console entry point
    (``lm_eval.__main__.cli_evaluate``: its argument parser, its evaluator, plain ``--model hf``) in this process:
    no new interpreter's imports (10-20 s a run), lm-eval's task folder indexed once per process. Returns what the
    subprocess would: the exit code (a ``SystemExit`` message is printed to stderr and exits 1, as Python does),
    stdout and stderr (lm-eval's log lines included). An exception that would end the subprocess with a traceback
    comes back as that traceback on stderr, exit 1, so a test that checks for "Traceback" still sees it.

    ``include_path`` (default: the installed task folder) and ``cwd`` (the folder the run starts in, for a relative
    ``include_path`` as a user types it in a checkout) are what the subprocess would be given.

    For the tests about what the task does inside lm-eval (pairing, references, warnings); the console script as
    a user runs it stays a subprocess (:func:`lm_eval_cli`) in the flows that test it."""
    import io
    import logging
    import traceback
    from contextlib import redirect_stderr, redirect_stdout

    import lm_eval.utils
    from lm_eval.__main__ import cli_evaluate

    from lm_eval_toolfid.cases.bundled import tasks_path

    argv = ["lm_eval", "--tasks", task, "--include_path", include_path or str(tasks_path()), "--model", "hf",
            "--model_args", model_args, "--output_path", str(out), "--log_samples", "--batch_size", "16",
            "--device", "cpu"]
    if metadata:
        argv += ["--metadata", json.dumps(metadata)]
    argv += extra or []
    stdout, stderr = io.StringIO(), io.StringIO()
    logger = logging.getLogger("lm_eval")
    handlers, propagate = list(logger.handlers), logger.propagate
    with pytest.MonkeyPatch.context() as mp, redirect_stdout(stdout), redirect_stderr(stderr):
        for key, value in {"TOOLFID_HOME": str(home), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                           **(env or {})}.items():
            mp.setenv(key, value)
        mp.setattr(sys, "argv", argv)
        if cwd is not None:
            mp.chdir(cwd)
        mp.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", False)  # its log handler writes to this run's stderr
        for handler in handlers:
            logger.removeHandler(handler)
        try:
            cli_evaluate()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except Exception:  # noqa: BLE001 - the subprocess would die with this traceback
            traceback.print_exc()
            code = 1
        finally:
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            for handler in handlers:
                logger.addHandler(handler)
            logger.propagate = propagate
    return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())


def toolfid_here(args: list, home: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``toolfid ARGS`` through the CLI's entry point (:func:`lm_eval_toolfid.cli.main`) in this process, with
    ``TOOLFID_HOME=home``: the exit code, stdout and stderr the console script would give, without a new
    interpreter's imports. For tests of what a command computes and prints; the console scripts themselves are
    run as subprocesses in tests/test_wheel.py and the served tests."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from lm_eval_toolfid.cli import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, redirect_stdout(out), redirect_stderr(err):
        for key, value in {"TOOLFID_HOME": str(home), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                           **(env or {})}.items():
            mp.setenv(key, value)
        mp.setattr(sys, "argv", ["toolfid", *argv])  # toolfid lm-eval sets sys.argv for lm-eval's parser
        code = main(argv)
    return subprocess.CompletedProcess(["toolfid", *argv], code, out.getvalue(), err.getvalue())
