#!/usr/bin/env bash
# What was run on the lent 2x H200 machine (see BENCHMARKS.md): the gpu-marked tests and the
# parity gate on CUDA (NCCL), plus the re-score timing. Expects megatron-core and pydantic (and
# their deps) as cp312 wheels in .whl/; writes logs and JSON reports under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/sglang tests/megatron 2>&1 | tail -n 25 | tee "$OUT/gpu_tests.log"
for c in qwen3_dense_true_on_policy_v1 qwen3_dense_true_on_policy_v2; do
  timeout 150 contractgen parity --device cuda --contract "$c" --layouts tp1,tp2,pp2,cp2 --quiet \
    --json "$OUT/parity_${c}_cuda.json" 2>&1 | tee "$OUT/parity_${c}_cuda.txt" | grep -v -i warn
done
timeout 60 python3 benchmarks/rescore_share.py --device cuda --repeats 5 2>&1 | tee "$OUT/rescore_cuda.txt"
