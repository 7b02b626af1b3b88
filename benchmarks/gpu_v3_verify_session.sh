#!/usr/bin/env bash
# Issue 32 on the lent H200 (2026-12-04): v3 after the opaque float32 add (the gpu tests of
# fixed_runs, the launch diagnosis), the static-runs persistent kernel sweep (tune_fixed_runs.py),
# then the tiny v3 gate WITH the transformers check. Expects the cp312 wheels in .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
log="$OUT/v3_verify_session.log"
cat "$OUT/env.txt" >>"$log" && rm -f "$OUT/env.txt" "$OUT/install.log"
step() {  # seconds, name, command...
  local limit=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  echo "== $name: exit $?, $((SECONDS - t0)) s" | tee -a "$log"
  grep -v '^{' "$OUT/$name.txt" | grep -v -i warn | tail -n 60 >>"$log"
}
step 150 pytest_fixed_runs python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_fixed_runs.py
step 60 diag_fixed_runs python3 benchmarks/diag_fixed_runs.py
step 200 tune_fixed_runs python3 benchmarks/tune_fixed_runs.py --json "$OUT/tune_fixed_runs.json"
step 150 gate_tiny_v3 contractgen parity --device cuda --quiet --layouts tp1 --rollout-tps 1 \
  --contract qwen3_dense_true_on_policy_v3 --json "$OUT/parity_tiny_v3_cuda.json"
rm -f "$OUT"/pytest_fixed_runs.txt "$OUT"/diag_fixed_runs.txt "$OUT"/gate_tiny_v3.txt
tail -n 48 "$OUT/tune_fixed_runs.txt"; rm -f "$OUT/tune_fixed_runs.txt"
