#!/usr/bin/env bash
# The trainer's fwd+bwd against transformers + SDPA (hf_sdpa, built as
# ../shared/bench/hf_trainer_baseline.py builds it): 32 x 512 tokens on the Qwen3-0.6B shape (v1 and
# v3) and 16 x 512 on Qwen3-4B (v3); the gate's rollout cold (empty Triton cache, 8 requests x 128
# tokens); the Qwen3-0.6B v3 gate with the transformers check. First run as issue 32's call H
# (2026-12-05). Expects the cp312 wheels in .whl/ (gpu_env.sh); writes under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log trainer_vs_transformers
for c in v3 v1; do
  step 90 "trainer_Qwen3-0.6B_${c}" python3 benchmarks/bench_trainer.py --device cuda --batch 32 \
    --seq 512 --model Qwen3-0.6B --models sglang,hf_sdpa --contract "qwen3_dense_true_on_policy_$c" \
    --json "$OUT/trainer_Qwen3-0.6B_${c}.json"
done
step 120 trainer_Qwen3-4B_v3_16x512 python3 benchmarks/bench_trainer.py --device cuda --batch 16 \
  --seq 512 --model Qwen3-4B --models sglang,hf_sdpa --contract qwen3_dense_true_on_policy_v3 \
  --json "$OUT/trainer_Qwen3-4B_v3_16x512.json"
TRITON_CACHE_DIR=$(mktemp -d) step 70 cold_rollout_v3 python3 benchmarks/cold_rollout.py \
  --device cuda --contract qwen3_dense_true_on_policy_v3 --model Qwen3-0.6B --requests 8 \
  --new-tokens 128 --json "$OUT/cold_rollout_v3.json"
step 150 gate_qwen3_0.6b_v3 contractgen parity --device cuda --layouts tp1 --rollout-tps 1 \
  --contract qwen3_dense_true_on_policy_v3 --model Qwen3-0.6B --requests 8 --new-tokens 128 \
  --json "$OUT/parity_qwen3_0.6b_v3_cuda.json"
grep -E "^== |passed|failed|phase|generate|rescore|result|sglang|hf_sdpa|transformers" "$log" | head -70
