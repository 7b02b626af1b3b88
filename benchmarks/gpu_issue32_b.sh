#!/usr/bin/env bash
# Issue 32 on the lent H200 (2026-12-04), call B: the gpu tests of the fixed_runs kernel and the
# CUDA-graph decode; rollout decode (eager, static buffers, CUDA graphs) at the Qwen3-0.6B shape,
# 32 requests, v1 and v3; one RL step at the Qwen3-0.6B shape (32 prompts x 4 samples x 256
# tokens, v3, tp1); the Qwen3-0.6B-shape v3 gate with the transformers check.
# Expects the cp312 wheels in .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_b
step 100 pytest_gpu python3 -m pytest -q -m gpu -p no:cacheprovider --durations 10 \
  tests/kernels/test_fixed_runs.py tests/sglang/test_decode_graph.py
step 80 rollout_v1 python3 benchmarks/bench_rollout.py --device cuda --batch 32 --prompt 128 \
  --steps 16 --json "$OUT/rollout_v1.json"
step 60 rollout_v3 python3 benchmarks/bench_rollout.py --device cuda --batch 32 --prompt 128 \
  --steps 16 --modes static,graph --contract qwen3_dense_true_on_policy_v3 --json "$OUT/rollout_v3.json"
step 150 rl_step_v3 contractgen parity --device cuda --contract qwen3_dense_true_on_policy_v3 \
  --model Qwen3-0.6B --layouts tp1 --rollout-tps 1 --train-steps 2 --requests 32 --new-tokens 256 \
  --json "$OUT/rl_step_qwen3_0.6b_v3_cuda.json"
step 140 gate_qwen3_0.6b_v3 contractgen parity --device cuda --quiet --layouts tp1 --rollout-tps 1 \
  --contract qwen3_dense_true_on_policy_v3 --model Qwen3-0.6B --requests 8 --new-tokens 128 \
  --json "$OUT/parity_qwen3_0.6b_v3_cuda.json"
grep -E "^== |result|passed|failed|ms/step|step " "$log" | head -60
