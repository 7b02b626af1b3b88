#!/usr/bin/env bash
# Issue 32 on the lent H200 (2026-12-04): v3 after the opaque float32 add (the gpu tests of
# fixed_runs, the launch diagnosis), the static-runs persistent kernel sweep (tune_fixed_runs.py),
# then the tiny v3 gate WITH the transformers check. Expects the cp312 wheels in .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log v3_verify_session
STEP_TAIL=60
step 150 pytest_fixed_runs python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_fixed_runs.py
step 60 diag_fixed_runs python3 benchmarks/diag_fixed_runs.py
step 200 tune_fixed_runs python3 benchmarks/tune_fixed_runs.py --json "$OUT/tune_fixed_runs.json"
step 150 gate_tiny_v3 contractgen parity --device cuda --quiet --layouts tp1 --rollout-tps 1 \
  --contract qwen3_dense_true_on_policy_v3 --json "$OUT/parity_tiny_v3_cuda.json"
grep -A 48 "^== tune_fixed_runs" "$log"
