#!/usr/bin/env bash
# Issue 32 on the lent H200 (2026-12-05), call F: the one-kernel small ops (RMSNorm, RoPE,
# SiLU-GLU, log-softmax chunk sums): gpu tests, bits against the references and cost
# (diag_small_ops.py); the static decode step's kernels with and without them (v3; the graph
# replays these); the tiny v3 gate with the transformers check; the trainer's fwd+bwd kernels
# against hf_sdpa (v3, 0.6B, 32 x 512); one RL step (8 x 4 x 64, v3, no gradient check) under
# cProfile for its host time. Expects the cp312 wheels in .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_f
STEP_TAIL=45
step 100 pytest_gpu python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_triton_small_ops.py \
  tests/sglang/test_decode_graph.py
step 80 small_ops python3 benchmarks/diag_small_ops.py --json "$OUT/small_ops.json"
for c in v3; do
  step 90 "decode_profile_$c" python3 benchmarks/bench_rollout.py --device cuda --batch 32 \
    --prompt 128 --steps 16 --modes static-ref,static,graph-ref,graph --profile 30 \
    --contract "qwen3_dense_true_on_policy_$c" --json "$OUT/decode_profile_$c.json"
done
step 70 gate_tiny_v3 contractgen parity --device cuda --layouts tp1 --rollout-tps 1 \
  --contract qwen3_dense_true_on_policy_v3 --json "$OUT/gate_tiny_v3.json"
step 120 trainer_profile_v3 python3 benchmarks/bench_trainer.py --device cuda --batch 32 --seq 512 \
  --models sglang,hf_sdpa --contract qwen3_dense_true_on_policy_v3 --profile 30 \
  --json "$OUT/trainer_profile_v3.json"
step 100 rl_step_cprofile python3 -m cProfile -o "$OUT/rl_step.prof" -m contractgen parity \
  --device cuda --contract qwen3_dense_true_on_policy_v3 --model Qwen3-0.6B --layouts tp1 \
  --rollout-tps 1 --train-steps 1 --no-grad-check --requests 8 --new-tokens 64 \
  --json "$OUT/rl_step_v3.json"
python3 -c "import pstats; pstats.Stats('$OUT/rl_step.prof').sort_stats('cumulative').print_stats(60)" \
  > "$OUT/rl_step_cumulative.txt" 2>&1
python3 -c "import pstats; pstats.Stats('$OUT/rl_step.prof').sort_stats('tottime').print_stats(40)" \
  > "$OUT/rl_step_tottime.txt" 2>&1
rm -f "$OUT/rl_step.prof"
grep -E "^== " "$log"
