#!/usr/bin/env bash
# The FSDP trainer target at the Qwen3-0.6B shape on one card. (a) Its gate with the
# transformers float32 check on (fsdp1 trainer, rollout TP 1, random weights), the JSON report in
# $OUT; (b) its fwd+bwd step time next to transformers + SDPA built as
# ../shared/bench/hf_trainer_baseline.py builds it (bench_trainer.py's fsdp and hf_sdpa rows: the
# same 32 x 512 token ids, one process). Each step under a timeout; the whole script fits 540 s
# (install ~60 s + 270 s + 150 s). First run for issue 33. Expects the cp312 wheels in .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log fsdp_trainer
STEP_TAIL=40
step 270 gate_fsdp1_qwen3_0.6b contractgen parity --device cuda --trainers fsdp --layouts fsdp1 \
  --rollout-tps 1 --model Qwen3-0.6B --contract qwen3_dense_true_on_policy_v1 --requests 8 \
  --new-tokens 64 --json "$OUT/parity_qwen3_0.6b_v1_cuda_fsdp1_reference.json"
step 150 trainer_fsdp_vs_hf_sdpa python3 benchmarks/bench_trainer.py --device cuda --batch 32 \
  --seq 512 --model Qwen3-0.6B --models fsdp,hf_sdpa --contract qwen3_dense_true_on_policy_v1 \
  --json "$OUT/trainer_qwen3_0.6b_v1_fsdp_vs_hf_sdpa.json"
f="$OUT/parity_qwen3_0.6b_v1_cuda_fsdp1_reference.json"
[ -f "$f" ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1]))
print('gate', r['device'], [(l['name'], l['exact'], l['tokens_compared']) for l in r['layouts']], r['seconds'])
ref = r.get('reference') or {}
print('reference', ref.get('name'), ref.get('max_abs_diff'), ref.get('within_tolerance'), r.get('reference_note'))" "$f" | tee -a "$log"
grep -E "^== |^fsdp |^hf_sdpa |result|gate|reference" "$log" | head -40
