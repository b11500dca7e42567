"""``toolfid check``: score generations without a model (see ``lm_eval_toolfid.check``)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from ..check import add_check_command

    add_check_command(sub)
