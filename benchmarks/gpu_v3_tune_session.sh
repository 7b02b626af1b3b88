#!/usr/bin/env bash
# Issue 32 on the lent H200: launch-shape sweep of v3's fused runs (persistent, then per-run under
# CUDA graphs), then the gate WITH the transformers check on the default tiny v1 model and on v3's.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
log="$OUT/v3_tune_session.log"
cat "$OUT/env.txt" >>"$log" && rm -f "$OUT/env.txt" "$OUT/install.log"
V3=qwen3_dense_true_on_policy_v3
timeout 200 python3 benchmarks/tune_matmul.py --contract $V3 --skip small \
  --persistent-grid 64:64:4:3:2:1,64:128:8:3:1:1,128:64:8:3:1:1,128:128:8:3:1:1,128:128:8:2:1:1,128:256:8:2:1:1,64:256:8:3:1:1,128:64:4:3:2:1 \
  --json "$OUT/tune_v3_persistent.json" 2>&1 | grep -v '^{' | tail -n 30 >>"$log"
echo "== tune persistent: $SECONDS s" >>"$log"
timeout 150 python3 benchmarks/tune_matmul.py --contract $V3 --skip persistent --cuda-graph \
  --small-grid 16:64:4:3:1,16:64:4:3:2,32:64:4:3:2,64:32:4:3:2,64:64:4:3:2,16:32:4:4:2,16:64:4:3:4,64:64:8:3:2 \
  --json "$OUT/tune_v3_small.json" 2>&1 | grep -v '^{' | tail -n 30 >>"$log"
echo "== tune small: $SECONDS s" >>"$log"
gate() {  # name, then parity arguments
  local name=$1; shift
  local t0=$SECONDS
  timeout 110 contractgen parity --device cuda --quiet --json "$OUT/parity_${name}_cuda.json" "$@" \
    2>&1 | grep -v -i warn | tail -n 25 >>"$log"
  echo "== $name: exit ${PIPESTATUS[0]}, $((SECONDS - t0)) s" | tee -a "$log"
}
gate tiny_v1 --layouts tp1 --rollout-tps 1
gate tiny_v3 --contract $V3 --layouts tp1 --rollout-tps 1
