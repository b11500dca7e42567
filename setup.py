"""Package discovery (the project's metadata is in pyproject.toml).

Every package and data folder under ``lm_eval_toolfid/`` ships, found rather than listed, and the
lm-eval task folder ``tasks/`` ships inside it as ``lm_eval_toolfid.tasks`` (``toolfid tasks-path``
prints where). ``tests/test_wheel.py`` checks that a built wheel holds every tracked file of both trees.
"""

from setuptools import find_namespace_packages, setup

TASKS = "lm_eval_toolfid.tasks"
DATA = ["*.json", "*.jsonl", "*.yaml", "*.md", "*.txt", "*.jinja"]

packages = find_namespace_packages(include=["lm_eval_toolfid", "lm_eval_toolfid.*"], exclude=["*.__pycache__"])
packages += [TASKS] + [f"{TASKS}.{name}" for name in find_namespace_packages("tasks", exclude=["*__pycache__*"])]
package_data = {"": DATA}
# the fixture model's folders hold weights and tokenizer files of every kind: ship them whole
package_data.update({name: ["*"] for name in packages if name.startswith("lm_eval_toolfid.fixtures")})

setup(packages=packages, package_dir={TASKS: "tasks"}, package_data=package_data)
