#!/usr/bin/env bash
# Issues 32 and 35 on the lent GPU, call O: the Qwen3-Next gate on CUDA with the transformers
# check (tiny reference model, tp1: the family's 3e-5 tolerance and the decode continued chunk by
# chunk, neither run on a GPU before); how fast a Triton GEMM can be on the v3 linear's shapes,
# plain and with 8 / 4 / 2 runs, against cuBLAS in one process (benchmarks/linear_ceiling.py);
# the v3 rollout decode step under CUDA graphs at the Qwen3-0.6B shape, 32 requests.
# Expects .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_35_o
STEP_TAIL=30
step 200 gate_qwen3_next_tiny contractgen parity --device cuda --quiet --layouts tp1 --rollout-tps 1 \
  --contract qwen3_next_true_on_policy_v1 --json "$OUT/parity_qwen3_next_tiny_cuda_reference.json"
STEP_TAIL=130
step 270 linear_ceiling python3 benchmarks/linear_ceiling.py --json "$OUT/linear_ceiling.json"
STEP_TAIL=30
step 100 decode_qwen3_0.6b_v3 python3 benchmarks/bench_rollout.py --device cuda --batch 32 \
  --prompt 128 --steps 16 --modes static,graph --contract qwen3_dense_true_on_policy_v3 \
  --json "$OUT/decode_qwen3_0.6b_v3.json"
grep -E "^== |Error|error" "$log" | head -20
