#!/usr/bin/env bash
# The GPU check (issue 44): at most 8 minutes on one H100, offline, on a machine with its own PyTorch (CUDA),
# transformers, peft and accelerate (Python 3.12; no vLLM, no model weights, no network). Every step is timed,
# its whole output kept in $OUT/STEP.log (OUT defaults to /tmp/gpu_check) and its last lines shown here:
#   0. what imports (python -c 'import X' for every dependency, versions against constraints.txt), then the
#      wheels in bench/wheels/ (pip --no-index --find-links bench/wheels, whatever is there) and this package
#      (pip install --no-deps -e ., so the machine's own torch stays; PYTHONPATH=src where pip cannot)
#   1. pytest -m gpu -q                       the gpu-marked tests
#   2. a SmolLM2-135M-shaped model, randomly initialised (seeded), saved with the tokenizer of
#      bench/assets/smollm2-tokenizer; two P4G co-training steps on it (synthetic personas) through
#      `scope train` with configs/gpu/train_p4g_cotrain_gpu.yaml's settings (a two-step copy, $OUT/train_DTYPE.yaml),
#      in bfloat16 and then float32 on cuda; metrics.jsonl's logprob_gap: < 1e-3 in float32 (checked), reported in
#      bfloat16; each run's peak memory measured (GPU: nvidia-smi's used memory over the run, polled)
#   3. python bench/gpu_train_step.py        ours vs TRL's GRPOTrainer, three shapes, LoRA and full, MFU
#                                              (here 2 steps, 1 warm-up, 1.5B full first; no new shape / mode after 100 s)
#   4. scope plan CONFIG --gpus 1 --gpu-memory 80 for step 2's bfloat16 run, against its measured peak
#
#   bash bench/gpu_check.sh          # on the GPU machine
#   bash bench/gpu_check.sh --cpu    # the same steps on this CPU, float32 only, tiny sizes (2-layer models): test it here first
#
# Ends with a table of the steps and `RESULT gpu_check failed=N`; exits 1 when a step failed. PYTHON=... picks the
# interpreter (default: .venv/bin/python when there is one, else python3).
#
# Wheels: anything the GPU image lacks must travel beside this script as a wheel in bench/wheels/ (untracked but
# not git-ignored, so the device copy carries it; keep it small). Step 0 prints each missing one with the line that
# fetches it; on a networked machine, for each (versions from constraints.txt):
#   pip download --no-deps --only-binary :all: --python-version 3.12 \
#     --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d bench/wheels PKG==VER
# What the steps import (read off a CPU run's sys.modules; step 0's list is the authority on the machine itself):
#   scope train / plan on an hf: model (steps 2, 4), besides torch transformers peft accelerate: tokenizers
#     safetensors huggingface-hub (filelock fsspec packaging), jinja2 markupsafe (chat templates), pydantic
#     pydantic-core annotated-types typing-inspection typing-extensions, pyyaml, typer click rich shellingham
#     markdown-it-py mdurl pygments, tqdm, numpy, psutil regex; plus setuptools, only so that pip can install this
#     package editable (without it the script falls back to PYTHONPATH=src). gguf, openai, httpx, matplotlib and
#     scikit-learn are dependencies the check never imports.
#   pytest (step 1): pytest pluggy iniconfig packaging
#   TRL's side of step 3: trl datasets pyarrow pandas python-dateutil tzdata dill multiprocess xxhash requests
#     cloudpickle (pyarrow is ~40 MB; without trl, step 3 still reports our side, with trl_tok_s=nan)
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=gpu
for arg in "$@"; do
  case "$arg" in
    --cpu) MODE=cpu ;;
    -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {print substr($0, 3)}' "$0"; exit 0 ;;
    *) echo "unknown argument $arg (use --cpu, or nothing)"; exit 2 ;;
  esac
done
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")  # the model (~0.5 GB) stays out of $OUT
trap 'rm -rf "$WORK"' EXIT
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
PY=$PYTHON
FAILED=0
SUMMARY=()
CHECK_STARTED=$(date +%s)
if [ "$MODE" = gpu ]; then
  DEVICE=cuda
  DTYPES="bfloat16 float32"
  # seconds per step; together with the installs they stay under 8 minutes
  LIMIT_PYTEST=75 LIMIT_MODEL=40 LIMIT_TRAIN=75 LIMIT_TRAIN_STEP=150 LIMIT_PLAN=25
  TRAIN_STEP_ARGS=(--steps 2 --warmup 1 --budget-s 100 --shapes qwen2.5-1.5b,qwen2.5-0.5b,smollm2-135m --modes full,lora)
  TINY=()
  MODEL_ARGS=()
else
  DEVICE=cpu
  DTYPES="float32"
  LIMIT_PYTEST=600 LIMIT_MODEL=300 LIMIT_TRAIN=1200 LIMIT_TRAIN_STEP=1800 LIMIT_PLAN=300
  TRAIN_STEP_ARGS=(--device cpu --layers 2 --prompts 2 --generations 2 --prompt-tokens 32 --new-tokens 8 --steps 1)
  TINY=(--tiny)
  MODEL_ARGS=(--layers 2)  # the shape's width, vocabulary and tokenizer, 2 of its 30 layers
fi

# run_step NAME LIMIT_S CMD...: CMD's output into $OUT/NAME.log, its last lines here, its time and status in the table.
run_step() {
  local name=$1 limit=$2
  shift 2
  local log="$OUT/$name.log" started rc took note=""
  started=$(date +%s)
  echo "== $name (limit ${limit} s): $*"
  timeout -k 10 "$limit" "$@" > "$log" 2>&1
  rc=$?
  took=$(( $(date +%s) - started ))
  tail -n "${TAIL:-12}" "$log" | sed 's/^/   | /'
  case $rc in
    0) note=ok ;;
    124 | 137) note="TIMED OUT after ${limit} s" ;;
    *) note="FAILED (exit $rc)" ;;
  esac
  [ $rc -eq 0 ] || FAILED=$((FAILED + 1))
  SUMMARY+=("$(printf '%-24s %6s s  %s' "$name" "$took" "$note")")
  echo "   -> $name: $note, ${took} s"
  return $rc
}

# skip_step NAME REASON: a step that could not run, in the table.
skip_step() {
  SUMMARY+=("$(printf '%-24s %6s    %s' "$1" - "SKIPPED: $2")")
  echo "== $1: skipped: $2"
}

echo "gpu_check ($MODE): output in $OUT, python $PY"
if [ "$MODE" = gpu ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi failed"
fi

# ---- 0. dependencies --------------------------------------------------------------------------------------
run_step 0-imports 120 "$PY" bench/_gpu_check.py imports
shopt -s nullglob
WHEELS=(bench/wheels/*.whl)
shopt -u nullglob
if [ ${#WHEELS[@]} -gt 0 ]; then
  # Into the interpreter's environment; where pip may not write there (an externally managed Python),
  # into a folder put first on PYTHONPATH.
  if ! run_step 0-wheels 180 "$PY" -m pip install --no-index --find-links bench/wheels --no-deps "${WHEELS[@]}"; then
    FAILED=$((FAILED - 1))
    run_step 0-wheels-target 180 "$PY" -m pip install --no-index --find-links bench/wheels --no-deps --target "$WORK/site" "${WHEELS[@]}" \
      && export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  run_step 0-imports-after 120 "$PY" bench/_gpu_check.py imports
fi
if "$PY" -c "import scope_marl, sys; sys.exit(0 if scope_marl.__file__.startswith('$PWD/src/') else 1)" 2> /dev/null; then
  echo "== 0-package: scope_marl already imports from $PWD/src"
else
  # --no-deps keeps the machine's torch; --no-build-isolation needs no network (setuptools must be there);
  # --ignore-requires-python in case this checkout still pins an older Python.
  if ! run_step 0-package 180 "$PY" -m pip install --no-deps --no-build-isolation --ignore-requires-python -e .; then
    FAILED=$((FAILED - 1))
    echo "   pip could not install the package; running it from src/ (PYTHONPATH)"
  fi
  "$PY" -c "import scope_marl" 2> /dev/null || export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
SCOPE=("$PY" -m scope_marl.cli)

# ---- 1. the gpu-marked tests ------------------------------------------------------------------------------
if "$PY" -c "import pytest" 2> /dev/null; then
  run_step 1-pytest-gpu "$LIMIT_PYTEST" "$PY" -m pytest -m gpu -q -p no:cacheprovider
  [ $? -eq 5 ] && echo "   (exit 5: pytest collected no gpu-marked test)"
else
  skip_step 1-pytest-gpu "pytest does not import (carry its wheels: pytest pluggy iniconfig)"
  FAILED=$((FAILED + 1))
fi

# ---- 2. two co-training steps on a random SmolLM2-shaped model, per dtype --------------------------------
if run_step 2-model "$LIMIT_MODEL" "$PY" bench/_gpu_check.py model "$WORK/model" "${MODEL_ARGS[@]}"; then
  for dtype in $DTYPES; do
    cfg="$OUT/train_$dtype.yaml"
    "$PY" bench/_gpu_check.py config configs/gpu/train_p4g_cotrain_gpu.yaml "$cfg" --model "$WORK/model" \
      --device "$DEVICE" --dtype "$dtype" "${TINY[@]}"
    rm -rf "$OUT/run_$dtype"
    run_step "2-train-$dtype" "$LIMIT_TRAIN" "$PY" bench/_gpu_check.py measure "$OUT/train_$dtype.measure.json" -- \
      "${SCOPE[@]}" train "$cfg" --out "$OUT/run_$dtype"
    rm -rf "$OUT/run_$dtype/checkpoints"  # weights and optimizer state: not what the check reads
    if [ -f "$OUT/run_$dtype/metrics.jsonl" ]; then
      if [ "$dtype" = float32 ]; then
        run_step "2-gap-$dtype" 60 "$PY" bench/_gpu_check.py gaps "$OUT/run_$dtype/metrics.jsonl" --max 1e-3 --label "${dtype}_"
      else
        run_step "2-gap-$dtype" 60 "$PY" bench/_gpu_check.py gaps "$OUT/run_$dtype/metrics.jsonl" --label "${dtype}_"
      fi
    else
      skip_step "2-gap-$dtype" "no metrics.jsonl (the training run failed)"
      FAILED=$((FAILED + 1))
    fi
  done
fi

# ---- 3. ours vs TRL, MFU ----------------------------------------------------------------------------------
run_step 3-gpu-train-step "$LIMIT_TRAIN_STEP" "$PY" bench/gpu_train_step.py "${TRAIN_STEP_ARGS[@]}"

# ---- 4. scope plan against step 2's measured peak ---------------------------------------------------------
if [ "$MODE" = gpu ]; then PLANNED=bfloat16; else PLANNED=float32; fi
if ! "${SCOPE[@]}" plan --help > /dev/null 2>&1; then
  skip_step 4-plan "this checkout has no 'scope plan' yet"
elif [ ! -f "$OUT/train_$PLANNED.yaml" ]; then
  skip_step 4-plan "step 2 wrote no $PLANNED config"
else
  compare_with=$OUT/plan_gpu.json
  if [ "$MODE" = gpu ]; then
    run_step 4-plan-gpu "$LIMIT_PLAN" "${SCOPE[@]}" plan "$OUT/train_$PLANNED.yaml" --gpus 1 --gpu-memory 80 --json "$OUT/plan_gpu.json"
  else
    # The same command line as on the GPU, on a copy with hardware.device: auto (a GPU plan refuses device: cpu);
    # what the CPU run really used is then the CPU plan's to match.
    "$PY" bench/_gpu_check.py config configs/gpu/train_p4g_cotrain_gpu.yaml "$OUT/plan_gpu.yaml" --model "$WORK/model" \
      --device auto --dtype auto "${TINY[@]}"
    run_step 4-plan-gpu "$LIMIT_PLAN" "${SCOPE[@]}" plan "$OUT/plan_gpu.yaml" --gpus 1 --gpu-memory 80 --json "$OUT/plan_gpu.json"
    run_step 4-plan-cpu "$LIMIT_PLAN" "${SCOPE[@]}" plan "$OUT/train_$PLANNED.yaml" --json "$OUT/plan_cpu.json"
    compare_with=$OUT/plan_cpu.json
  fi
  if [ -f "$compare_with" ] && [ -f "$OUT/train_$PLANNED.measure.json" ]; then
    run_step 4-plan-vs-measured 30 "$PY" bench/_gpu_check.py compare "$compare_with" "$OUT/train_$PLANNED.measure.json"
  else
    skip_step 4-plan-vs-measured "no plan JSON or no measured run"
  fi
fi

echo
echo "gpu_check ($MODE) in $(( $(date +%s) - CHECK_STARTED )) s; logs in $OUT"
printf '  %s\n' "${SUMMARY[@]}"
for log in "$OUT"/*.log; do
  grep "^RESULT" "$log" | sed "s|^|  $(basename "$log" .log): |"
done
echo "RESULT gpu_check mode=$MODE failed=$FAILED seconds=$(( $(date +%s) - CHECK_STARTED ))"
[ "$FAILED" -eq 0 ]
