#!/usr/bin/env bash
# Issue 32 on the lent H200 (2026-12-05), call G, one call for the session's changes: the gpu
# tests of the one-kernel small ops, the batched sampler and in-place weight loads under CUDA
# graphs; the small ops' bits against the references and their cost (diag_small_ops.py); the
# decode step with and without them (v3); the tiny v3 gate with the transformers check; the RL
# step at half the target workload (16 prompts x 4 samples x 256 tokens, 2 steps, v3, tp1; step 1
# is the warm one): the trainer runs one microbatch, and the target's 128 sequences (~45k tokens)
# would need ~3.7 MB a token at the 0.6B shape (BENCHMARKS.md), more than the H200 holds. Expects the cp312 wheels in .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_g
STEP_TAIL=30
step 110 pytest_gpu python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/kernels/test_triton_small_ops.py tests/sglang/test_sampling.py tests/sglang/test_decode_graph.py
step 60 small_ops python3 benchmarks/diag_small_ops.py --json "$OUT/small_ops.json"
step 70 decode_v3 python3 benchmarks/bench_rollout.py --device cuda --batch 32 --prompt 128 \
  --steps 16 --modes static-ref,static,graph-ref,graph --contract qwen3_dense_true_on_policy_v3 \
  --json "$OUT/decode_v3.json"
step 60 gate_tiny_v3 contractgen parity --device cuda --layouts tp1 --rollout-tps 1 \
  --contract qwen3_dense_true_on_policy_v3 --json "$OUT/gate_tiny_v3.json"
step 230 rl_step_16x4x256 contractgen parity --device cuda --contract qwen3_dense_true_on_policy_v3 \
  --model Qwen3-0.6B --layouts tp1 --rollout-tps 1 --train-steps 2 --requests 16 --new-tokens 256 \
  --no-grad-check --json "$OUT/rl_step_qwen3_0.6b_v3_cuda_16x4x256.json"
for f in "$OUT"/rl_step_*.json; do
  [ -f "$f" ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1]))
for s in r['steps']: print('rl step', s['step'], s.get('exact'), s.get('ratio_max_abs_dev'), s.get('response_tokens_per_s'), s['time_s'])" "$f" | tee -a "$log"
done
grep -E "^== |passed|failed|result|rl step|mode|static|graph|bound" "$log" | head -70
