#!/usr/bin/env bash
# What a machine with an NVIDIA GPU runs end to end (not run in CI): a vLLM server on the GPU, two training
# steps of P4G co-training whose rollouts all play on it (adapters pushed after each update), then one panel
# evaluation of the trained agent. Run `make setup` first; vLLM gets its own venv on the first start.
#   bash bench/gpu_run.sh            # writes runs/gpu/ (OUT=... PORT=... to change)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu}
PORT=${PORT:-8001}
SCOPE=.venv/bin/scope
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
$SCOPE serve vllm --device cuda --install-only
$SCOPE serve vllm --device cuda --model embedded --port "$PORT" > "$OUT/vllm.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
start=$(date +%s)
until curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null; do
  kill -0 "$SERVER" || { echo "the vLLM server exited; see $OUT/vllm.log"; exit 1; }
  sleep 2
done
echo "vLLM ready after $(( $(date +%s) - start )) s"
sed "s#http://127.0.0.1:8001#http://127.0.0.1:$PORT#" configs/gpu/train_p4g_cotrain_vllm.yaml > "$OUT/train.yaml"
/usr/bin/time -f "train: %e s wall" $SCOPE train "$OUT/train.yaml" --out "$OUT/cotrain"
python3 - "$OUT/cotrain/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"step {r['step']}: " + ", ".join(f"{role} gap max {r[role]['logprob_gap']:.2e} mean {r[role]['logprob_gap_mean']:.2e} reward {r[role]['reward_mean']:.3f}" for role in ("train_agent", "train_user") if role in r))
PY
/usr/bin/time -f "eval: %e s wall" $SCOPE eval --checkpoint "$OUT/cotrain" --panel offline --out "$OUT/eval"
