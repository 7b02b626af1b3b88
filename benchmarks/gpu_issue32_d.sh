#!/usr/bin/env bash
# Issue 32 on the lent H200 (2026-12-04), call D: where a cold rollout's time goes (call C's
# Qwen3-0.6B v3 gate: generate 43.6 s, re-score 27.1 s, against 13.0 s and 0.09 s for v2 on
# 2026-12-03): cold_rollout.py for v3 and v1 with an empty Triton cache each; the gpu test that
# failed to compile in call B; the trainer at the Qwen3-4B shape at 16 x 512 tokens (32 x 512
# ran out of memory in call C). Expects the cp312 wheels in .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_d
for c in v3 v1; do
  TRITON_CACHE_DIR=$(mktemp -d) step 120 "cold_rollout_$c" python3 benchmarks/cold_rollout.py \
    --device cuda --contract "qwen3_dense_true_on_policy_$c" --model Qwen3-0.6B --requests 8 \
    --new-tokens 128 --json "$OUT/cold_rollout_$c.json"
done
step 60 pytest_gpu python3 -m pytest -q -m gpu -p no:cacheprovider \
  "tests/kernels/test_fixed_runs.py::test_fixed_runs_fields_change_the_bits"
step 110 trainer_Qwen3-4B_v3_16x512 python3 benchmarks/bench_trainer.py --device cuda --batch 16 \
  --seq 512 --model Qwen3-4B --models sglang,hf_sdpa --contract qwen3_dense_true_on_policy_v3 \
  --json "$OUT/trainer_Qwen3-4B_v3_16x512.json"
grep -E "^== |passed|failed|phase|generate|rescore|sglang|hf_sdpa" "$log" | head -60
