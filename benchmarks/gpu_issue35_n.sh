#!/usr/bin/env bash
# Issue 35 on the lent GPU, call N: the Qwen3-Next gate on CUDA with the transformers check at
# the family's tolerance and the decode continued chunk by chunk (tiny reference model, tp1).
# Expects .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue35_n
STEP_TAIL=30
step 200 gate_qwen3_next_tiny contractgen parity --device cuda --quiet --layouts tp1 --rollout-tps 1 \
  --contract qwen3_next_true_on_policy_v1 --json "$OUT/parity_qwen3_next_tiny_cuda_reference.json"
grep -E "^== |Error|error" "$log" | head -20
