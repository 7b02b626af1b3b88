#!/usr/bin/env bash
# LoRA true-on-policy on the Llama-3.2-1B shape (its public dims,
# random weights written by --model, transformers' init, seed 0) at tp1, rollout TP 1:
#   (a) the one-shot gate with a seeded r=8 adapter (alpha 12) on q/k/v/o/gate/up/down, served
#       unmerged on both sides, with the transformers + peft float32 check;
#   (b) --train-steps 3 under the adapter (base frozen, adapter-only push, digest handshake),
#       no gradient check, with each step's time split (rollout, trainer, push, ...).
# First run for issue 34 (2026-12-06).
# The machine has no peft: besides the cp312 wheels gpu_env.sh installs, .whl/ must hold
# peft-0.21.2, accelerate-1.16.0 (peft imports it) and psutil-7.2.2 (abi3; accelerate's);
# gpu_env.sh installs every .whl/*.whl. Whole script <= 540 s: install ~30 s, then the steps'
# limits (20 + 230 + 250 s).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log lora
CONTRACT=llama3_dense_lora_true_on_policy_v1
MODEL=${MODEL:-Llama-3.2-1B}
step 20 peft_import python3 -c "import peft, accelerate; print('peft', peft.__version__, 'accelerate', accelerate.__version__)"
step 230 gate_lora8 contractgen parity --device cuda --contract "$CONTRACT" --model "$MODEL" \
  --layouts tp1 --rollout-tps 1 --lora 8 --json "$OUT/gate_lora8_llama3.2_1b_cuda.json"
step 250 rl_lora8_3steps contractgen parity --device cuda --contract "$CONTRACT" --model "$MODEL" \
  --layouts tp1 --rollout-tps 1 --lora 8 --train-steps 3 --no-grad-check \
  --json "$OUT/rl_lora8_llama3.2_1b_cuda.json"
f="$OUT/gate_lora8_llama3.2_1b_cuda.json"
[ -f "$f" ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1]))
print('gate exact', [(l['name'], l['exact'], l['max_abs_diff']) for l in r['layouts']])
ref = r.get('reference') or {}
print('gate reference', ref.get('name'), ref.get('max_abs_diff'), ref.get('within_tolerance'))
print('gate seconds', r.get('seconds'))" "$f" | tee -a "$log"
f="$OUT/rl_lora8_llama3.2_1b_cuda.json"
[ -f "$f" ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1]))
for s in r['steps']:
    e = s['per_layout'][0]
    print('rl step', s['step'], s.get('exact'), s.get('ratio_max_abs_dev'), s.get('push'), e['time_s'])" "$f" | tee -a "$log"
grep -E "^== |result|rl step|gate |push|Error|error" "$log" | head -40
