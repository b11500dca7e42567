"""Dependency ranges are what the tests run, at both ends.

``pyproject.toml`` gives lm-eval, transformers, PEFT and torch a range (never an ``==`` pin that would replace the
lm-eval of an environment running other suites); ``.ci/lowest.txt`` pins each to its lower bound; ``.ci/run`` (the
README's test command) runs the whole suite on the newest releases allowed and the quick tier again in
``.venv-lowest`` made from those pins (``scripts/setup_lowest.sh``), less tests/test_power.py: the verdict's
error-rate arithmetic (numpy and the scoring core, no model, no lm-eval call), run once, in the main run, to keep the
command within its 15 minutes. This module runs in both environments: each
checks that what is installed is inside the declared ranges.
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
BOUNDED = ("torch", "lm-eval", "transformers", "peft")


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    out: dict[str, Requirement] = {}
    for req in reqs:
        if req.name in BOUNDED and (req.name not in out or not out[req.name].specifier):
            out[req.name] = req
    return out


def _lower(req: Requirement) -> str:
    lows = [s.version for s in req.specifier if s.operator == ">="]
    assert len(lows) == 1, f"{req}: one lower bound (>=) expected"
    return lows[0]


def _pins() -> dict[str, str]:
    text = (REPO / ".ci" / "lowest.txt").read_text()
    return dict(re.findall(r"^([\w.-]+)==(\S+)$", text, flags=re.M))


def test_ranges_not_pins_and_the_lowest_environment_pins_the_lower_bounds() -> None:
    reqs, pins = _requirements(), _pins()
    for name in BOUNDED:
        req = reqs[name]
        assert not any(s.operator == "==" for s in req.specifier), f"{req}: a range, not a pin"
        assert Version(pins[name]) == Version(_lower(req)), f".ci/lowest.txt {name}=={pins[name]} but {req}"
    # lm-eval: at least the newest and one older 0.4.x release in the range
    lm_eval = reqs["lm-eval"].specifier
    assert lm_eval.contains("0.4.13") and lm_eval.contains("0.4.12")
    # every mention of lm-eval in the project's requirements (the serve extra too) has the same range
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    every = project["dependencies"] + [r for e in project["optional-dependencies"].values() for r in e]
    ranges = {str(Requirement(r).specifier) for r in every if Requirement(r).name == "lm-eval"}
    assert len(ranges) == 1, ranges


def test_ci_runs_the_quick_tier_on_the_lowest_versions_and_the_readme_says_so() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    command = next(line for line in ci.splitlines() if "pytest" in line)
    assert "bash scripts/setup_lowest.sh" in command
    assert '.venv-lowest/bin/python -m pytest -q -rs -m "not slow" --ignore tests/test_power.py --ignore tests/test_served_connection.py' in command
    assert command in (REPO / "README.md").read_text()  # the README's test command is what CI runs


def test_what_is_installed_is_inside_the_declared_ranges() -> None:
    for name, req in _requirements().items():
        installed = version(name).split("+")[0]
        assert req.specifier.contains(installed, prereleases=True), f"{name} {installed} outside {req}"
