#!/usr/bin/env bash
# Issue 32 on the lent H200 (2026-12-04), call E, after the sampler sorts a truncating row on its
# own device (call D: warm generate 15.3 s for 8 requests x 128 tokens, the host's float64 sort
# of each truncating row ~18 ms): the gpu sampler and decode-graph tests; cold_rollout v3 again;
# one RL step at the Qwen3-0.6B shape (8 prompts x 4 samples x 64 tokens, v3, tp1) for its time
# split; the Qwen3-0.6B v3 gate with the transformers check. Expects the cp312 wheels in .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_e
step 60 pytest_gpu python3 -m pytest -q -m gpu -p no:cacheprovider tests/sglang/test_sampling.py \
  tests/sglang/test_decode_graph.py
TRITON_CACHE_DIR=$(mktemp -d) step 80 cold_rollout_v3 python3 benchmarks/cold_rollout.py \
  --device cuda --contract qwen3_dense_true_on_policy_v3 --model Qwen3-0.6B --requests 8 \
  --new-tokens 128 --json "$OUT/cold_rollout_v3.json"
step 170 rl_step_v3 contractgen parity --device cuda --contract qwen3_dense_true_on_policy_v3 \
  --model Qwen3-0.6B --layouts tp1 --rollout-tps 1 --train-steps 1 --requests 8 --new-tokens 64 \
  --json "$OUT/rl_step_qwen3_0.6b_v3_cuda.json"
step 170 gate_qwen3_0.6b_v3 contractgen parity --device cuda --layouts tp1 --rollout-tps 1 \
  --contract qwen3_dense_true_on_policy_v3 --model Qwen3-0.6B --requests 8 --new-tokens 128 \
  --json "$OUT/parity_qwen3_0.6b_v3_cuda.json"
grep -E "^== |passed|failed|phase|generate|rescore|result|step|time" "$log" | head -60
