#!/usr/bin/env bash
# Issue 32 on the lent GPU, call R: after call Q. The one-run small-M tile (16 x 32 at M <= 16,
# chosen from call Q's bench_v4_shapes.py) through the GPU kernel tests (its bits against the
# other one-run tiles) and the v4 linear table with every M under a CUDA
# graph (call Q's eager M = 4096 times were floored by the host's launch cost); the v4 gate on the
# tiny model with the transformers check (the rollout's decode takes the new tile); v1's trainer
# at the Qwen3-4B shape where the card holds it (issue 32's v1 target). Expects .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_r
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
