#!/usr/bin/env bash
# The GPU machine's kit (docs/device_runs.md): wheels for CPython 3.12 (.whl/) and the SmolLM2 GGUF in pieces
# (.gguf/N/), both ignored by git, sized so each device call carries < 60 MiB with the working tree; prints which
# folders each call carries, in order. Run it in the checkout the device calls are made from, on a machine that
# reaches PyPI, after `bash scripts/setup.sh` (the versions are this checkout's .venv's). Idempotent.
#   bash scripts/device_kit.sh            # make (or refresh) the kit, print the plan
#   bash scripts/device_kit.sh --check    # re-measure the tree against the kit made before, print the plan
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "device_kit: no .venv here: run bash scripts/setup.sh first" >&2; exit 4; }
exec .venv/bin/python -m scripts.device_kit "$@"
