#!/usr/bin/env bash
# Issue 32's RL-step throughput target on the lent H200 (rl-throughput branch, not yet run on a
# GPU): the GPU tests of what the branch touched (sampler, in-place weight loads under CUDA
# graphs); the weight-sync bench at Qwen3-0.6B (old path vs new, CPU parts); the baseline RL step
# (8 prompts x 4 samples x 64 tokens, as 2026-12-04: rollout 19.5 s, weight sync 4.87 s); then the
# target workload, 32 prompts x 4 samples x 256 tokens, 2 steps (step 1 is the warm one: the kept
# engine's graphs captured at step 0). Read steps[].time_s and steps[].response_tokens_per_s from
# the JSON (target >= 2,000 at step 1). Expects the cp312 wheels in .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log rl_throughput
step 120 pytest_gpu python3 -m pytest -q -m gpu -p no:cacheprovider tests/sglang/test_sampling.py \
  tests/sglang/test_decode_graph.py
step 90 weight_sync python3 benchmarks/bench_weight_sync.py --model Qwen3-0.6B \
  --json "$OUT/weight_sync_qwen3_0.6b.json"
step 150 rl_step_8x4x64 contractgen parity --device cuda --contract qwen3_dense_true_on_policy_v3 \
  --model Qwen3-0.6B --layouts tp1 --rollout-tps 1 --train-steps 2 --requests 8 --new-tokens 64 \
  --no-grad-check --json "$OUT/rl_step_qwen3_0.6b_v3_cuda_8x4x64.json"
step 300 rl_step_32x4x256 contractgen parity --device cuda --contract qwen3_dense_true_on_policy_v3 \
  --model Qwen3-0.6B --layouts tp1 --rollout-tps 1 --train-steps 2 --requests 32 --new-tokens 256 \
  --no-grad-check --json "$OUT/rl_step_qwen3_0.6b_v3_cuda_32x4x256.json"
for f in "$OUT"/rl_step_*.json; do
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))
for s in r['steps']: print(sys.argv[1].rsplit('/',1)[-1], s['step'], s['response_tokens_per_s'], s['time_s'])" "$f" | tee -a "$log"
done
grep -E "^== |passed|failed|result|step" "$log" | head -60
