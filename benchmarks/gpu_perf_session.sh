#!/usr/bin/env bash
# Issue 10's remaining rows on the lent 1x H200 machine (see BENCHMARKS.md): the trainer's
# forward+backward against megatron-core's local spec at Qwen3-0.6B shape (4x512 tokens, as the
# baseline, and 16k packed tokens, the target), the rollout decode at 32 requests x 256 new tokens
# against the same engine with stock ops, then the gpu-marked tests. Expects megatron-core and
# pydantic (and their deps) as cp312 wheels in .whl/; writes logs and JSON reports under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
for shape in "4 512" "32 512"; do
  set -- $shape
  timeout 200 python3 benchmarks/bench_trainer.py --device cuda --batch "$1" --seq "$2" --iters 3 \
    --json "$OUT/trainer_${1}x${2}.json" 2>&1 | grep -v -i warn | tee "$OUT/trainer_${1}x${2}.txt"
done
if [ "${ROLLOUT:-1}" != 0 ]; then  # ROLLOUT=0: the trainer rows only
  timeout 240 python3 benchmarks/bench_kernels.py --device cuda --sections rollout --batch 32 \
    --steps "${STEPS:-256}" --json "$OUT/rollout_32x256.json" 2>&1 | grep -v -i warn | tee "$OUT/rollout_32x256.txt"
fi
if [ -n "${GPU_TESTS:-}" ]; then
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/sglang tests/megatron tests/kernels 2>&1 \
    | tail -n 25 | tee "$OUT/gpu_tests.log"
fi
