#!/usr/bin/env bash
# Issues 32 and 35 on the lent GPU, call M, every gate WITH the transformers check: the
# Qwen3-Next gate (tiny reference model, tp1; the linear-attention ops as device-generic torch
# beside the Triton backend), the default gate (tiny v1), the v3 gate at the Qwen3-0.6B shape
# (8 requests x 128 new tokens), then the v1 and v3 trainers against transformers + SDPA in one
# process (32 x 512 tokens, Qwen3-0.6B shape). Expects .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_35_m
python3 -c 'import transformers as t; print("Qwen3NextForCausalLM:", hasattr(t, "Qwen3NextForCausalLM"))' >>"$log" 2>&1
STEP_TAIL=30
step 200 gate_qwen3_next_tiny contractgen parity --device cuda --quiet --layouts tp1 --rollout-tps 1 \
  --contract qwen3_next_true_on_policy_v1 --json "$OUT/parity_qwen3_next_tiny_cuda_reference.json"
step 150 gate_tiny_v1 contractgen parity --device cuda --quiet --layouts tp1 --rollout-tps 1 \
  --json "$OUT/parity_tiny_v1_cuda_reference.json"
step 200 gate_qwen3_0.6b_v3 contractgen parity --device cuda --quiet --layouts tp1 --rollout-tps 1 \
  --contract qwen3_dense_true_on_policy_v3 --model Qwen3-0.6B --requests 8 --new-tokens 128 \
  --json "$OUT/parity_qwen3_0.6b_v3_cuda_reference.json"
for c in v1 v3; do
  step 150 "trainer_qwen3_0.6b_$c" python3 benchmarks/bench_trainer.py --device cuda --batch 32 \
    --seq 512 --models sglang,hf_sdpa --contract $c --iters 3 \
    --json "$OUT/trainer_qwen3_0.6b_${c}.json"
done
grep -E "^== |Error|error" "$log" | head -20
