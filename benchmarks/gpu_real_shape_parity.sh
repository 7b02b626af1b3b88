#!/usr/bin/env bash
# Real-shape parity on CUDA (first run for issue 10 on an H200; see BENCHMARKS.md): a random-weight
# checkpoint shaped like $MODEL (benchmarks/random_checkpoint.py, transformers' own init), then
# `contractgen parity --device cuda` at $LAYOUTS x rollout TPs $ROLLOUT_TPS (default 1,2) on $REQUESTS requests x
# $NEW_TOKENS new tokens. GPU_TESTS=1 first runs the gpu-marked tests. Expects megatron-core and
# pydantic (and their deps) as cp312 wheels in .whl/; writes logs and JSON reports under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
MODEL=${MODEL:-Qwen3-0.6B}
LAYOUTS=${LAYOUTS:-tp1,tp2,pp2,cp2}
REQUESTS=${REQUESTS:-8}
NEW_TOKENS=${NEW_TOKENS:-128}
ROLLOUT_TPS=${ROLLOUT_TPS:-1,2}
TAG=$(echo "$MODEL" | tr 'A-Z.' 'a-z_')
if [ -n "${GPU_TESTS:-}" ]; then
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/sglang tests/megatron tests/kernels 2>&1 \
    | tail -n 25 | tee "$OUT/gpu_tests.log"
fi
timeout 240 python3 benchmarks/random_checkpoint.py --name "$MODEL" --out "/tmp/ckpt_$TAG" \
  2>&1 | tee "$OUT/checkpoint_$TAG.txt"
/usr/bin/time -f "%e s wall, %M KB peak RSS (parent)" timeout "${BIG_TIMEOUT:-420}" contractgen parity \
  --device cuda --checkpoint "/tmp/ckpt_$TAG" --layouts "$LAYOUTS" --rollout-tps "$ROLLOUT_TPS" \
  --requests "$REQUESTS" --new-tokens "$NEW_TOKENS" --no-reference --json "$OUT/parity_${TAG}_cuda.json" \
  2>&1 | grep -v -i warn | tee "$OUT/parity_${TAG}_cuda.txt"
