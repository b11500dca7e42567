"""``toolfid demo``: ``toolfid run`` on the bundled fixture model and its four adapters."""

from __future__ import annotations

import argparse
import os

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.cli.common import FIXTURE_TASK
from lm_eval_toolfid.cli.run import add_run_options, cmd_run


def cmd_demo(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything the demo loads ships in the package
    paths = fixture_paths()
    args.base = paths["base"]
    args.adapter = [f"{name}={path}" for name, path in paths["adapters"].items()]  # type: ignore[union-attr]
    args.task = FIXTURE_TASK
    return cmd_run(args)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="toolfid run on the bundled fixture model and its four adapters",
                       description="toolfid run on the bundled tiny fixture model and its four adapters "
                                   "(faithful, hallucinating, broken, prose_after_results); runs offline.")
    add_run_options(p)
    p.set_defaults(func=cmd_demo)
