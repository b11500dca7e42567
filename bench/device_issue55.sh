#!/usr/bin/env bash
# Issue 55's GPU measurement in one device call (docs/device_runs.md): decode steps captured and replayed against
# eager ones on SmolLM2 (real weights), bfloat16, the default cases. Run from the repo root on the GPU machine, in
# the LAST of the calls scripts/device_kit.sh plans; the earlier calls run it with --stash (copy what they carry
# to $KIT, which outlives a call while the machine stays warm).
#
#   bash bench/device_issue55.sh --stash     # calls 1..K-1: copy the carried .whl/ and .gguf/N/ to $KIT
#   bash bench/device_issue55.sh             # call K: stash, set up, measure; everything under $OUT
#   DEVICE=cpu CASES=4 ADAPTERS=2 REPEAT=1 MODEL=<folder> bash bench/device_issue55.sh    # rehearsal on a CPU
#
# Steps, most wanted first (each under its own `timeout`, never past BUDGET seconds from the start; a step's
# failure is recorded and the script goes on): set-up (venv over the image, the wheels, the project editable; the
# GGUF reassembled, sha256 checked, converted), the base view eager then replayed (bench/gpu_base_pace.py), the GPU
# tests (tests/test_step_graphs.py), base + ADAPTERS views replayed with the B = 0 view's answers against the
# base's (bench/bench_joint_views.py; a base + B = 0 run if that one gave no count), base + ADAPTERS eager (the
# cheapest to lose: known to be slow). Back under $OUT (at most 8 files): summary.json (bench/device_summary.py
# explains its fields), device.log (every step's output), tokens_eager.json, tokens_graphs.json, pytest.xml.
#
# On a CPU (DEVICE=cpu) the venv and wheels are skipped (SETUP=none: this checkout's .venv runs it) unless
# SETUP=venv with IMAGE_PYTHON (an interpreter standing in for the image) and a KIT of wheels for its CPython
# (scripts/device_kit.sh --wheels-for); MODEL skips the conversion (the pieces are still reassembled and checked when
# .gguf/ is there); --cuda-graphs runs eagerly at the captured steps' shapes: no replay figures (summary.json says so).
set -uo pipefail
cd "$(dirname "$0")/.."
{ # the whole script is read before it runs: an edit of this file during a run cannot shift what runs
KIT=${KIT:-/tmp/kit}
OUT=${OUT:-/tmp/issue55-out}
DEVICE=${DEVICE:-cuda}
CASES=${CASES:-382}
ADAPTERS=${ADAPTERS:-10}
EAGER_CASES=${EAGER_CASES:-$CASES}
REPEAT=${REPEAT:-2}
BUDGET=${BUDGET:-480}
CAP_SCALE=${CAP_SCALE:-1}  # each step's cap times this (a slow CPU's rehearsal)
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ "$DEVICE" = cpu ]; then DTYPE=${DTYPE:-float32}; else DTYPE=${DTYPE:-bfloat16}; fi
if [ "$DEVICE" = cpu ]; then SETUP=${SETUP:-none}; else SETUP=${SETUP:-venv}; fi
IMAGE_PYTHON=${IMAGE_PYTHON:-python3}  # the image's interpreter (torch in it); the venv is made over it
WHEELS=${WHEELS:-.whl}  # where the carried wheels are (another folder: a rehearsal's wheels for another CPython)
export IMAGE_PYTHON KIT GGUF_SHA256 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

stash() {
  mkdir -p "$KIT/whl" "$KIT/gguf"
  if [ -d "$WHEELS" ]; then cp -f "$WHEELS"/*.whl "$KIT/whl/" 2>/dev/null; fi
  for d in .gguf/*/; do [ -d "$d" ] && cp -f "$d"smollm2.gguf.* "$KIT/gguf/" 2>/dev/null; done
  echo "kit in $KIT: $(ls "$KIT/whl" | wc -l) wheels; GGUF pieces: $(ls "$KIT/gguf" | tr '\n' ' ')"
}
stash
[ "${1:-}" = --stash ] && exit 0

T0=$(date +%s)
mkdir -p "$OUT"
W=$(mktemp -d)  # the benches' JSON and the steps' records: summary.json gathers them
LOG=$OUT/device.log
: >"$LOG"
: >"$W/steps.tsv"
echo "issue 55 on $DEVICE: cases $CASES, adapters $ADAPTERS (eager joint: $EAGER_CASES cases), $DTYPE," \
  "repeat $REPEAT, budget $BUDGET s" | tee -a "$LOG"

record() {  # NAME STATUS RC SECONDS CAP WHY (and the time it ended, seconds since the epoch)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" "$(date +%s)" >>"$W/steps.tsv"
  echo "step $1: $2 (rc $3, $4 s of at most $5 s)${6:+: $6}" | tee -a "$LOG"
}

step() {  # NAME CAP COMMAND...: run under `timeout`, never past the budget (15 s kept for the summary)
  local name=$1 cap=$(($2 * CAP_SCALE))
  shift 2
  local t=$((T0 + BUDGET - 15 - $(date +%s)))
  ((t > cap)) && t=$cap
  if ((t < 20)); then
    record "$name" skipped 0 0 "$cap" "no time left in the budget of $BUDGET s"
    return 1
  fi
  echo "=== $name (at most $t s): $*" >>"$LOG"
  local s rc status
  s=$(date +%s)
  if declare -F "$1" >/dev/null; then  # a function of this script: `timeout` runs it in a bash of its own
    timeout -k 10 "$t" bash -c "$(declare -f "$1"); $*" >>"$LOG" 2>&1
  else
    timeout -k 10 "$t" "$@" >>"$LOG" 2>&1
  fi
  rc=$?
  case $rc in 0) status=ok ;; 124 | 137) status=timeout ;; *) status=failed ;; esac
  local why=""  # a failed step's last line of output (a traceback's error line, reassemble's reason)
  [ $rc -ne 0 ] && why=$(tail -n 1 "$LOG" | tr '\t' ' ' | cut -c1-300)
  record "$name" "$status" "$rc" "$(($(date +%s) - s))" "$t" "$why"
  return $rc
}

finish() {
  # the fallback's link goes (a rehearsal runs in a real checkout)
  [ -f "$KIT/linked-tasks" ] && rm -f lm_eval_toolfid/tasks "$KIT/linked-tasks"
  local py=python3
  [ -x "${PY:-}" ] && py=$PY
  "$py" bench/device_summary.py "$W" "$OUT" --device "$DEVICE" --cases "$CASES" --adapters "$ADAPTERS" \
    --eager-cases "$EAGER_CASES" --seconds $(($(date +%s) - T0)) --commit "${COMMIT:-unknown}" >>"$LOG" 2>&1 ||
    echo "summary failed: see device.log" | tee -a "$LOG"
  cat "$OUT/summary.json" 2>/dev/null
  exit 0
}

# --- set-up: the interpreter with the wheels and the project; the model -------------------------------------------
setup_venv() {
  local v=$KIT/venv
  # pip inside the venv, or else the image's through image.pth (an interpreter without ensurepip)
  "$IMAGE_PYTHON" -m venv "$v" || { rm -rf "$v" && "$IMAGE_PYTHON" -m venv --without-pip "$v"; } || return 1
  "$IMAGE_PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' \
    >"$("$v/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/image.pth" || return 1
  "$v/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile "$KIT"/whl/*.whl ||
    return 1
  if ! "$v/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-build-isolation \
    -e .; then
    echo "editable install failed: the tree on the path instead, tasks/ linked as lm_eval_toolfid/tasks"
    [ -e lm_eval_toolfid/tasks ] || { ln -s ../tasks lm_eval_toolfid/tasks && touch "$KIT/linked-tasks"; }
    pwd >"$("$v/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/toolfid-tree.pth"
  fi
}
if [ "$SETUP" = none ]; then
  PY=${PY:-$PWD/.venv/bin/python}
  echo "SETUP=none: no venv, no wheels installed: $PY runs every step" | tee -a "$LOG"
else
  PY=$KIT/venv/bin/python
  step setup_venv 150 setup_venv || { echo "no interpreter to run the steps with" | tee -a "$LOG"; finish; }
fi
step environment 60 "$PY" -c '
import json, sys, torch, transformers, peft, lm_eval_toolfid
from importlib.metadata import version
cuda = torch.cuda.is_available()
env = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
       "peft": peft.__version__, "lm_eval": version("lm_eval"), "toolfid": lm_eval_toolfid.__file__,
       "gpu": torch.cuda.get_device_name(0) if cuda else None, "cuda": torch.version.cuda}
print(json.dumps(env))
open(sys.argv[1], "w").write(json.dumps(env))' "$W/environment.json"

reassemble() {
  local n
  n=$(ls "$KIT"/gguf/smollm2.gguf.1-of-* 2>/dev/null | sed 's/.*-of-//')
  [ -n "$n" ] || { echo "no GGUF piece 1 in $KIT/gguf"; return 1; }
  for i in $(seq 1 "$n"); do
    [ -f "$KIT/gguf/smollm2.gguf.$i-of-$n" ] || {
      echo "GGUF piece $i of $n missing in $KIT/gguf: the machine went back between calls; make them again from call 1"
      return 1
    }
  done
  for i in $(seq 1 "$n"); do cat "$KIT/gguf/smollm2.gguf.$i-of-$n"; done >"$KIT/smollm2.gguf"
  echo "$GGUF_SHA256  $KIT/smollm2.gguf" | sha256sum -c -
}
export TOOLFID_CACHE=${TOOLFID_CACHE:-$KIT/cache}  # the tests' `smollm2` fixture finds the converted folder here
if [ -z "${MODEL:-}" ]; then
  MODEL=$TOOLFID_CACHE/models/smollm2-135m-instruct
  step gguf 60 reassemble || finish
  step convert 120 "$PY" -c "import sys; from pathlib import Path; sys.path.insert(0, '.')
from scripts.real_models import convert_gguf
print(convert_gguf(Path('$KIT/smollm2.gguf'), Path('$MODEL')))" || finish
else
  if ls "$KIT"/gguf/smollm2.gguf.* >/dev/null 2>&1; then step gguf 60 reassemble; fi
  [ "$DEVICE" = cpu ] && unset TOOLFID_CACHE  # the machine's own converted models, for the tests
  echo "MODEL=$MODEL: no conversion" | tee -a "$LOG"
fi

# --- the measurements, most wanted first -----------------------------------------------------------------------------
COMMON=(--model "$MODEL" --device "$DEVICE" --dtype "$DTYPE")
step pace_eager 150 "$PY" bench/gpu_base_pace.py "${COMMON[@]}" --cases "$CASES" --repeat "$REPEAT" \
  --tokens-out "$OUT/tokens_eager.json" --json-out "$W/pace_eager.json"
REF=()
[ -s "$OUT/tokens_eager.json" ] && REF=(--tokens-ref "$OUT/tokens_eager.json")
step pace_graphs 150 "$PY" bench/gpu_base_pace.py "${COMMON[@]}" --cases "$CASES" --repeat "$REPEAT" --cuda-graphs \
  "${REF[@]}" --tokens-out "$OUT/tokens_graphs.json" --json-out "$W/pace_graphs.json"
# pytest: the project's plugin alone (the image's own pytest plugins are built for its pytest, not the carried one)
step pytest 200 env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$PY" -m pytest -p xdist.plugin -p no:cacheprovider -n 0 -q -rs \
  --junitxml="$OUT/pytest.xml" tests/test_step_graphs.py
step joint_graphs 200 "$PY" bench/bench_joint_views.py "${COMMON[@]}" --cases "$CASES" --adapters "$ADAPTERS" \
  --modes together --cuda-graphs --json-out "$W/joint_graphs.json"
if ! grep -q '"zero_differ"' "$W/joint_graphs.json" 2>/dev/null; then  # the B = 0 count alone, base + B = 0
  step b0 120 "$PY" bench/bench_joint_views.py "${COMMON[@]}" --cases "$CASES" --adapters 1 --modes together \
    --cuda-graphs --json-out "$W/b0.json"
fi
step joint_eager 240 "$PY" bench/bench_joint_views.py "${COMMON[@]}" --cases "$EAGER_CASES" --adapters "$ADAPTERS" \
  --modes together --json-out "$W/joint_eager.json"
finish
exit 0
}
