#!/usr/bin/env bash
# Set up a local virtualenv (.venv) with everything the project needs. Idempotent.
# torch is installed first and pinned, so nothing later can pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==${TORCH_VERSION:-2.13.0}" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import torch, lm_eval, peft, transformers, lm_eval_toolfid" \
  || { echo "setup failed: see pip output above" >&2; exit 1; }
