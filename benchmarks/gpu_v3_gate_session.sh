#!/usr/bin/env bash
# Issue 32 on the lent H200: the gpu tests of fixed_runs (persistent launch vs a decode row, the
# 16-row twin), the v3 linear against cuBLAS (plain and under CUDA graphs), then the gate WITH the
# transformers check: tiny v3, Qwen3-0.6B shape v3 and v1 (the final tree).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
log="$OUT/v3_gate_session.log"
cat "$OUT/env.txt" >>"$log" && rm -f "$OUT/env.txt" "$OUT/install.log"
V3=qwen3_dense_true_on_policy_v3
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_fixed_runs.py 2>&1 \
  | grep -E "passed|failed|FAILED|Error" | tail -n 12 >>"$log"
echo "== pytest: $SECONDS s" >>"$log"
timeout 120 python3 benchmarks/bench_kernels.py --device cuda --sections linear --cuda-graph \
  --contract $V3 --json "$OUT/linear_v3.json" 2>&1 | grep -v '^{' | tail -n 40 >>"$log"
echo "== linear: $SECONDS s" >>"$log"
gate() {  # name, then parity arguments
  local name=$1; shift
  local t0=$SECONDS
  timeout 150 contractgen parity --device cuda --quiet --layouts tp1 --rollout-tps 1 \
    --json "$OUT/parity_${name}_cuda.json" "$@" 2>&1 | grep -v -i warn | tail -n 22 >>"$log"
  echo "== $name: exit ${PIPESTATUS[0]}, $((SECONDS - t0)) s" | tee -a "$log"
}
gate tiny_v3 --contract $V3
gate qwen3_0.6b_v3 --contract $V3 --model Qwen3-0.6B --requests 8 --new-tokens 128
gate qwen3_0.6b_v1 --model Qwen3-0.6B --requests 8 --new-tokens 128
