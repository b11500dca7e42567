#!/usr/bin/env python3
"""Regenerate the bundled default case set from its vocabulary (``lm_eval_toolfid/cases/vocab/``).

Writes ``lm_eval_toolfid/cases/default_cases.jsonl`` and ``default_cases_stats.md`` next to it and
prints the statistics block. The generator is :mod:`lm_eval_toolfid.cases.generate`; edit the
vocabulary files, not this script. A case that fails its checks is one line on stderr, exit 4.

Usage: python scripts/make_default_cases.py
"""

from __future__ import annotations

import sys

from lm_eval_toolfid.cases.generate import write
from lm_eval_toolfid.core.errors import EXIT_USER_ERROR, ToolfidError


def main() -> int:
    try:
        print(write(), end="")
    except ToolfidError as exc:
        print(f"make_default_cases: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
