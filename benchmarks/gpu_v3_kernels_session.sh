#!/usr/bin/env bash
# Issue 32 on the lent H200, kernels: the gpu tests of the fixed_runs (v3) and v1 Triton matmul,
# then the linear benchmark for v1 and v3 side by side with cuBLAS (one process each), then the
# launch-shape sweep for v3's fused runs. Expects the cp312 wheels in .whl/ (gpu_env.sh); writes
# JSON and one log under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
log="$OUT/v3_kernels_session.log"
cat "$OUT/env.txt" >>"$log" && rm -f "$OUT/env.txt" "$OUT/install.log"
step() {  # seconds, name, command...
  local limit=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  echo "== $name: exit $?, $((SECONDS - t0)) s" | tee -a "$log"
  tail -n 40 "$OUT/$name.txt" >>"$log"
}
step 170 pytest_kernels python3 -m pytest -q -m gpu -p no:cacheprovider -x \
  tests/kernels/test_fixed_runs.py tests/kernels/test_triton_kernels.py -k "matmul or fixed_runs"
step 100 linear_v1 python3 benchmarks/bench_kernels.py --device cuda --sections linear \
  --json "$OUT/linear_v1.json"
step 100 linear_v3 python3 benchmarks/bench_kernels.py --device cuda --sections linear \
  --contract qwen3_dense_true_on_policy_v3 --json "$OUT/linear_v3.json"
step 200 tune_v3 python3 benchmarks/tune_matmul.py --contract qwen3_dense_true_on_policy_v3 \
  --ceiling --json "$OUT/tune_v3.json"
rm -f "$OUT"/pytest_kernels.txt "$OUT"/linear_v1.txt "$OUT"/linear_v3.txt
