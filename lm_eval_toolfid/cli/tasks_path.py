"""``toolfid tasks-path``: the folder to give ``lm_eval --include_path``."""

from __future__ import annotations

import argparse

from lm_eval_toolfid.cases.bundled import tasks_path


def cmd_tasks_path(_: argparse.Namespace) -> int:
    print(tasks_path())
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tasks-path", help="print the task folder for lm_eval --include_path",
                       description="Print the task folder for lm_eval --include_path.")
    p.set_defaults(func=cmd_tasks_path)
