#!/usr/bin/env bash
# The Qwen3-Next gate on CUDA with the transformers check at the family's tolerance and the
# decode continued chunk by chunk (tiny reference model, tp1). First run as issue 35's call N.
# Expects .whl/ (gpu_env.sh); writes under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log qwen3_next_gate
STEP_TAIL=30
step 200 gate_qwen3_next_tiny contractgen parity --device cuda --quiet --layouts tp1 --rollout-tps 1 \
  --contract qwen3_next_true_on_policy_v1 --json "$OUT/parity_qwen3_next_tiny_cuda_reference.json"
grep -E "^== |Error|error" "$log" | head -20
