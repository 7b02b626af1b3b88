#!/usr/bin/env bash
# One RL step at the target workload on one card (32 prompts x 4 samples x 256 tokens, v3,
# Qwen3-0.6B shape, tp1, 2 steps; step 1 is the warm one) in 4 microbatches (--train-microbatches,
# fp32 gradient accumulation: one microbatch of 128 sequences does not fit), after the gpu tests of
# the small ops, the sampler and the decode graph. First run as issue 32's call I (2026-12-05).
# Expects the cp312 wheels in .whl/ (gpu_env.sh); writes under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log rl_step
STEP_TAIL=30
step 110 pytest_gpu python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
  tests/kernels/test_triton_small_ops.py tests/sglang/test_sampling.py tests/sglang/test_decode_graph.py
step 330 rl_step_32x4x256 contractgen parity --device cuda --contract qwen3_dense_true_on_policy_v3 \
  --model Qwen3-0.6B --layouts tp1 --rollout-tps 1 --train-steps 2 --requests 32 --new-tokens 256 \
  --train-microbatches 4 --no-grad-check --json "$OUT/rl_step_qwen3_0.6b_v3_cuda_32x4x256_mb4.json"
for f in "$OUT"/rl_step_*.json; do
  [ -f "$f" ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1]))
for s in r['steps']: print('rl step', s['step'], s.get('exact'), s.get('ratio_max_abs_dev'), s.get('response_tokens_per_s'), s['per_layout'][0]['time_s'])" "$f" | tee -a "$log"
done
grep -E "^== |passed|failed|FAILED|result|rl step" "$log" | head -40
