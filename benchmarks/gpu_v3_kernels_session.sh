#!/usr/bin/env bash
# Issue 32 on the lent H200, kernels: the gpu tests of the fixed_runs (v3) and v1 Triton matmul,
# then the linear benchmark for v1 and v3 side by side with cuBLAS (one process each), then the
# launch-shape sweep for v3's fused runs. Expects the cp312 wheels in .whl/ (gpu_env.sh); writes
# JSON and one log under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log v3_kernels_session
step 170 pytest_kernels python3 -m pytest -q -m gpu -p no:cacheprovider -x \
  tests/kernels/test_fixed_runs.py tests/kernels/test_triton_kernels.py -k "matmul or fixed_runs"
step 100 linear_v1 python3 benchmarks/bench_kernels.py --device cuda --sections linear \
  --json "$OUT/linear_v1.json"
step 100 linear_v3 python3 benchmarks/bench_kernels.py --device cuda --sections linear \
  --contract qwen3_dense_true_on_policy_v3 --json "$OUT/linear_v3.json"
step 200 tune_v3 python3 benchmarks/tune_matmul.py --contract qwen3_dense_true_on_policy_v3 \
  --ceiling --json "$OUT/tune_v3.json"
