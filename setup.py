"""Package discovery (the project's metadata is in pyproject.toml).

Every package under ``lm_eval_toolfid/`` ships, found rather than listed, and the lm-eval task
folder ``tasks/`` ships inside it as ``lm_eval_toolfid.tasks`` (``toolfid tasks-path`` prints where).
"""

from setuptools import find_packages, setup

TASKS = "lm_eval_toolfid.tasks"

packages = find_packages(include=["lm_eval_toolfid", "lm_eval_toolfid.*"])
packages += [TASKS] + [f"{TASKS}.{name}" for name in find_packages("tasks")]

setup(packages=packages, package_dir={TASKS: "tasks"})
