#!/usr/bin/env bash
# Issue 32 on the lent H200 (2026-12-04), call C: the trainer, fwd+bwd at 32 x 512 = 16k packed
# tokens, ours (v1 and v3) against transformers + SDPA (hf_sdpa, built as
# ../shared/bench/hf_trainer_baseline.py builds it) in one process, at the Qwen3-0.6B and
# Qwen3-4B shapes; then the Qwen3-0.6B-shape v3 gate with the transformers check and its stacks
# every 40 s (call B's timed out at 140 s printing nothing). Expects the cp312 wheels in .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue32_c
for model in Qwen3-0.6B Qwen3-4B; do
  for c in v1 v3; do
    [ "$model/$c" = Qwen3-4B/v1 ] && continue
    step 130 "trainer_${model}_${c}" python3 benchmarks/bench_trainer.py --device cuda --batch 32 \
      --seq 512 --model "$model" --models sglang,hf_sdpa --contract "qwen3_dense_true_on_policy_$c" \
      --json "$OUT/trainer_${model}_${c}.json"
  done
done
t0=$SECONDS
timeout 170 python3 benchmarks/with_stacks.py 40 parity --device cuda --layouts tp1 --rollout-tps 1 \
  --contract qwen3_dense_true_on_policy_v3 --model Qwen3-0.6B --requests 8 --new-tokens 128 \
  --json "$OUT/parity_qwen3_0.6b_v3_cuda.json" >"$OUT/gate_qwen3_0.6b_v3.txt" 2>&1
echo "== gate_qwen3_0.6b_v3: exit $?, $((SECONDS - t0)) s (whole output in gate_qwen3_0.6b_v3.txt)" | tee -a "$log"
grep -E "^== |sglang|hf_sdpa|^parity" "$log" "$OUT/gate_qwen3_0.6b_v3.txt" | head -80
