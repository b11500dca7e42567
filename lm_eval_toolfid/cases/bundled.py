"""Paths of what ships inside the package: the task folder, the default cases, the fixtures."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

FIXTURE_ADAPTERS = ("faithful", "hallucinating", "broken", "prose_after_results")


def _pkg(package: str, *parts: str) -> Path:
    return Path(str(resources.files(package).joinpath(*parts)))


def tasks_path() -> Path:
    """The folder to give lm-eval as ``--include_path``."""
    return _pkg("lm_eval_toolfid.tasks")


def default_cases_path() -> Path:
    return _pkg("lm_eval_toolfid.cases", "default_cases.jsonl")


def fixture_cases_path() -> Path:
    return _pkg("lm_eval_toolfid.fixtures", "cases.jsonl")


def fixture_paths() -> dict[str, object]:
    """``{"base": …, "adapters": {name: …}, "cases": …}`` for the bundled tiny model."""
    return {
        "base": str(_pkg("lm_eval_toolfid.fixtures", "base")),
        "adapters": {name: str(_pkg("lm_eval_toolfid.fixtures", "adapters", name)) for name in FIXTURE_ADAPTERS},
        "cases": str(fixture_cases_path()),
    }
