"""``toolfid import-bfcl``: BFCL single-turn question/answer files → a case file (see ``lm_eval_toolfid.bfcl``)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from ..bfcl import add_import_bfcl_command

    add_import_bfcl_command(sub)
