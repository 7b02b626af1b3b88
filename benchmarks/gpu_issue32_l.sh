#!/usr/bin/env bash
# Issue 32 on the lent GPU, call L: the fused SiLU-GLU backward and the forwards without their
# .contiguous() copies. (a) the mlp/norm kernels' CUDA tests (fused backward == the float32 chain
# bit for bit, strided reads, no FMA in the PTX); (b) the SiLU-GLU backward alone at
# 16384 x 3072 bf16, fused against the chain and the pre-733c406 chain in one process (bits and
# median ms), and the strided forwards against copy + kernel; the whole v3 trainer model's
# gradients new against old (the fused backward swapped for the legacy chain) at the Qwen3-0.6B
# shape; (c) the v3 trainer against transformers + SDPA with the 40 costliest kernels, as call J.
# Expects .whl/. Results under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_l
step 400 pytest_mlp_norm_kernels python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_silu_glu_backward.py tests/kernels/test_triton_small_ops.py \
  tests/kernels/test_backward_widening.py
STEP_TAIL=30
step 300 diag_silu_glu_backward python3 benchmarks/diag_silu_glu_backward.py \
  --json "$OUT/silu_glu_backward_16384x3072.json"
step 400 diag_backward_casts python3 benchmarks/diag_backward_casts.py --device cuda \
  --batch 32 --seq 512 --contract v3
STEP_TAIL=120
step 300 trainer_profile_v3 python3 benchmarks/bench_trainer.py --device cuda --batch 32 --seq 512 \
  --models sglang,hf_sdpa --contract v3 --iters 3 --profile 40 \
  --json "$OUT/trainer_qwen3_0.6b_v3_profile.json"
grep -E "^== |Error|error" "$log" | head -20
