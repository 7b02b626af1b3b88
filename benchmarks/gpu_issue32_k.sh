#!/usr/bin/env bash
# Issue 32 on the lent GPU, call K: the backward casts. The RMSNorm / RoPE / SiLU-GLU backwards
# without float32 copies of their narrow operands, against the old functions: bit for bit alone
# (tests/kernels/test_backward_widening.py, and the forward kernels' own tests) and over the whole
# v3 trainer model at the Qwen3-0.6B shape (32 x 512 tokens), with each one's backward time and
# the step's elementwise and copy kernels. Expects .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_k
step 300 pytest_backward_casts python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_backward_widening.py tests/kernels/test_triton_small_ops.py
STEP_TAIL=30
step 400 diag_backward_casts python3 benchmarks/diag_backward_casts.py --device cuda \
  --batch 32 --seq 512 --contract v3
grep -E "^== |Error|error" "$log" | head -20
