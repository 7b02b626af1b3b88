#!/usr/bin/env bash
# Issue 32 on the lent H200 (2026-12-04), call A: gpu tests (fixed_runs, the Triton kernels, the
# rollout's CUDA-graph decode), the v3 linear against cuBLAS (plain and under CUDA graphs), the
# vendored kernel module against SGLang's own kernel (scratch/sglang_tp_invariant_ops.py, carried
# by hand, never committed), then the tiny gates of the three fixed_runs contracts WITH the
# transformers check. Expects the cp312 wheels in .whl/; writes JSON and one log under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_a
STEP_TAIL=45
step 170 pytest_gpu python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/kernels/test_fixed_runs.py \
  tests/kernels/test_triton_kernels.py tests/sglang -k "matmul or fixed_runs or fused or graph or decode"
step 110 linear_v3 python3 benchmarks/bench_kernels.py --device cuda --sections linear --cuda-graph \
  --contract qwen3_dense_true_on_policy_v3 --json "$OUT/linear_v3.json"
step 80 vendored_vs_sglang python3 benchmarks/vendored_kernel_vs_sglang.py \
  --sglang-kernel scratch/sglang_tp_invariant_ops.py --json "$OUT/vendored_vs_sglang.json"
gate() {  # seconds, name, parity arguments...
  local limit=$1 name=$2; shift 2
  step "$limit" "gate_$name" contractgen parity --device cuda --quiet --layouts tp1 --rollout-tps 1 \
    --json "$OUT/parity_${name}_cuda.json" "$@"
}
gate 70 tiny_v3 --contract qwen3_dense_true_on_policy_v3
gate 70 tiny_llama3_v2 --contract llama3_dense_true_on_policy_v2
gate 90 tiny_moe_v3 --contract qwen3_moe_true_on_policy_v3
grep -E "^== |result|max \|diff\||bits equal on" "$log"
