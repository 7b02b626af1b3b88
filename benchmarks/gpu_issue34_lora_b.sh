#!/usr/bin/env bash
# Issue 34, second call (after gpu_issue34_lora.sh's --train-steps failed on an H100 in the CUDA
# graph capture: the rollout read alpha on the host at every adapted linear). On one CUDA GPU:
#   (a) the CUDA decode-graph tests, the new LoRA one among them (graphs == eager with an adapter,
#       then a pushed adapter replayed in place);
#   (b) --lora 8 --train-steps 3 on the Llama-3.2-1B shape at tp1, rollout TP 1 (as in the first
#       script), each step's time split and push bytes in the JSON.
# Whole script <= 540 s: install ~30 s, then 120 + 300 s. Needs peft/accelerate/psutil in .whl/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
source "$(dirname "$0")/gpu_steps.sh"
gpu_log issue34_lora_b
STEP_TAIL=60
CONTRACT=llama3_dense_lora_true_on_policy_v1
MODEL=${MODEL:-Llama-3.2-1B}
step 120 pytest_decode_graph_gpu python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
  tests/sglang/test_decode_graph.py
step 300 rl_lora8_3steps contractgen parity --device cuda --contract "$CONTRACT" --model "$MODEL" \
  --layouts tp1 --rollout-tps 1 --lora 8 --train-steps 3 --no-grad-check \
  --json "$OUT/rl_lora8_llama3.2_1b_cuda.json"
f="$OUT/rl_lora8_llama3.2_1b_cuda.json"
[ -f "$f" ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1]))
for s in r['steps']:
    e = s['per_layout'][0]
    print('rl step', s['step'], s.get('exact'), s.get('ratio_max_abs_dev'), s.get('push'), e['time_s'])" "$f" | tee -a "$log"
grep -E "^== |result|rl step|passed|failed|Error" "$log" | head -40
