"""``toolfid fixtures``: print the bundled fixture paths."""

from __future__ import annotations

import argparse
import json

from lm_eval_toolfid.cases.bundled import fixture_paths


def cmd_fixtures(_: argparse.Namespace) -> int:
    print(json.dumps(fixture_paths(), indent=2))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fixtures", help="print the bundled fixture paths as JSON",
                       description="Print the bundled fixture model, adapters and case file paths as JSON.")
    p.set_defaults(func=cmd_fixtures)
