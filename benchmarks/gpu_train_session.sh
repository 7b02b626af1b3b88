#!/usr/bin/env bash
# `contractgen parity --train-steps` on the lent 2x H200 machine (see BENCHMARKS.md): the tiny
# reference model, then a random-weight Qwen3-0.6B-shaped checkpoint, 5 RL steps each, trainer
# tp1 and tp2 x rollout TP 1 and 2, NCCL. Expects megatron-core and pydantic (and their deps) as
# cp312 wheels in .whl/; writes logs and JSON reports under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
STEPS=${STEPS:-5}
if [ -z "${SKIP_TINY:-}" ]; then
  timeout 150 contractgen parity --device cuda --train-steps "$STEPS" --layouts tp1,tp2 \
    --rollout-tps 1,2 --json "$OUT/train_tiny_cuda.json" 2>&1 | grep -v -i warn | tee "$OUT/train_tiny_cuda.txt"
fi
timeout 90 python3 benchmarks/random_checkpoint.py --name Qwen3-0.6B --out /tmp/qwen3-0.6b-random \
  2>&1 | tee "$OUT/checkpoint.txt"
timeout "${BIG_TIMEOUT:-290}" contractgen parity --device cuda --checkpoint /tmp/qwen3-0.6b-random \
  --train-steps "$STEPS" --layouts tp1,tp2 --rollout-tps 1,2 --json "$OUT/train_qwen3_0.6b_cuda.json" \
  2>&1 | grep -v -i warn | tee "$OUT/train_qwen3_0.6b_cuda.txt"
