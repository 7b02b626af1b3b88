#!/usr/bin/env bash
# Issue 32 on the lent GPU (2026-12-05/06), call J: where the v3 trainer's 1.27x over transformers +
# SDPA goes. One training step of each model under torch.profiler, its 40 costliest kernels
# (Qwen3-0.6B shape, 32 x 512 tokens, v3), next to the timed fwd/bwd split. Expects .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_j
STEP_TAIL=120
step 300 trainer_profile_v3 python3 benchmarks/bench_trainer.py --device cuda --batch 32 --seq 512 \
  --models sglang,hf_sdpa --contract v3 --iters 3 --profile 40 \
  --json "$OUT/trainer_qwen3_0.6b_v3_profile.json"
grep -E "^== |Error|error" "$log" | head -20
