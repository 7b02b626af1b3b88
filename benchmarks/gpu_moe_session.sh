#!/usr/bin/env bash
# What was run on the lent 1x H200 machine for Qwen3-MoE (issue 13, see BENCHMARKS.md): the MoE
# gate on CUDA at TP1 for v1 and v2 (EP and TP>1 need a GPU per rank: not lent this session),
# with the transformers reference. Expects the cp312 wheels in .whl/; writes under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
for c in qwen3_moe_true_on_policy_v1 qwen3_moe_true_on_policy_v2; do
  timeout 200 contractgen parity --device cuda --contract "$c" --layouts tp1 --rollout-tps 1 \
    --quiet --json "$OUT/parity_${c}_cuda.json" 2>&1 | tee "$OUT/parity_${c}_cuda.txt" | grep -v -i warn
done
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
