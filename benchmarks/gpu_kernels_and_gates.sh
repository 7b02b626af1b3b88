#!/usr/bin/env bash
# The v4 GPU kernels and gates on one card: the column/fixed-runs kernel tests, the v4 linear
# table against cuBLAS with every M under a CUDA graph (bench_v4_linear.py --graph-all), the tiny
# v4 gate with the transformers check, and v1's trainer at the Qwen3-4B shape against transformers
# + SDPA (32 x 512 where the card holds it, else 16 x 512). First run as issue 32's call R
# (2026-12-07, H100; docs/benchmarks/). Expects .whl/ (gpu_env.sh); writes under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log kernels_and_gates
STEP_TAIL=12
step 110 gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_column_runs.py \
  tests/kernels/test_fixed_runs.py
STEP_TAIL=40
step 120 v4_linear_graph python3 benchmarks/bench_v4_linear.py --graph-all --json "$OUT/v4_linear_graph.json"
STEP_TAIL=25
step 150 gate_tiny_v4 contractgen parity --device cuda --layouts tp1 --rollout-tps 1 \
  --contract qwen3_dense_true_on_policy_v4 --json "$OUT/parity_tiny_v4_cuda_reference.json"
if python3 -c 'import torch, sys; sys.exit(torch.cuda.get_device_properties(0).total_memory < 120e9)'; then
  step 180 trainer_qwen3_4b_v1 python3 benchmarks/bench_trainer.py --device cuda --batch 32 \
    --seq 512 --model Qwen3-4B --models sglang,hf_sdpa --contract v1 --iters 3 \
    --json "$OUT/trainer_qwen3_4b_v1.json"
else
  step 180 trainer_qwen3_4b_v1_16x512 python3 benchmarks/bench_trainer.py --device cuda --batch 16 \
    --seq 512 --model Qwen3-4B --models sglang,hf_sdpa --contract v1 --iters 3 \
    --json "$OUT/trainer_qwen3_4b_v1_16x512.json"
fi
grep -E "^== |Error|error" "$log" | head -20
