#!/usr/bin/env bash
# Issue 32 on the lent GPU, call P: v4 (one float32 dot for column-parallel matmuls, v3's runs
# for row-parallel ones). The v4 and v3 linears against cuBLAS with v4's bitwise batch-invariance
# checks across launch tiles (bench_v4_linear.py); the GPU kernel tests; the v4 gate WITH the
# transformers check (tiny, and the Qwen3-0.6B shape, 8 x 128 new tokens); the v4 trainer against
# transformers + SDPA in one process; the v4 rollout decode step under CUDA graphs.
# Expects .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_p
STEP_TAIL=60
step 150 v4_linear python3 benchmarks/bench_v4_linear.py --json "$OUT/v4_linear.json"
STEP_TAIL=30
step 120 gate_tiny_v4 contractgen parity --device cuda --quiet --layouts tp1 --rollout-tps 1 \
  --contract qwen3_dense_true_on_policy_v4 --json "$OUT/parity_tiny_v4_cuda_reference.json"
step 150 gate_qwen3_0.6b_v4 contractgen parity --device cuda --quiet --layouts tp1 --rollout-tps 1 \
  --contract qwen3_dense_true_on_policy_v4 --model Qwen3-0.6B --requests 8 --new-tokens 128 \
  --json "$OUT/parity_qwen3_0.6b_v4_cuda_reference.json"
step 120 trainer_qwen3_0.6b_v4 python3 benchmarks/bench_trainer.py --device cuda --batch 32 \
  --seq 512 --models sglang,hf_sdpa --contract v4 --iters 3 --json "$OUT/trainer_qwen3_0.6b_v4.json"
step 100 gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_column_runs.py \
  tests/kernels/test_fixed_runs.py
step 60 decode_qwen3_0.6b_v4 python3 benchmarks/bench_rollout.py --device cuda --batch 32 \
  --prompt 128 --steps 16 --modes graph --contract qwen3_dense_true_on_policy_v4 \
  --json "$OUT/decode_qwen3_0.6b_v4.json"
grep -E "^== |Error|error" "$log" | head -20
