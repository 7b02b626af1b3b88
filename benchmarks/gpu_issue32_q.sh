#!/usr/bin/env bash
# Issue 32 on the lent GPU, call Q: what call P left open. The GPU kernel tests with the fixed
# rollout-row test; the row-parallel linears per rank at TP 1/2/4/8 and the one-run column calls'
# small-M launch tiles (bench_v4_shapes.py, bitwise against the 128 x 256 rows first); v1's
# trainer against transformers + SDPA (issue 32's v1 target, never measured); the v4 linear table
# again (the 90 % launch rule, k/v_proj at M = 4096). Expects .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_q
STEP_TAIL=30
step 110 gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_column_runs.py \
  tests/kernels/test_fixed_runs.py
STEP_TAIL=60
step 120 trainer_qwen3_0.6b_v1 python3 benchmarks/bench_trainer.py --device cuda --batch 32 \
  --seq 512 --models sglang,hf_sdpa --contract v1 --iters 3 --json "$OUT/trainer_qwen3_0.6b_v1.json"
step 240 v4_shapes python3 benchmarks/bench_v4_shapes.py --json "$OUT/v4_shapes.json"
step 150 v4_linear python3 benchmarks/bench_v4_linear.py --json "$OUT/v4_linear.json"
grep -E "^== |Error|error" "$log" | head -20
