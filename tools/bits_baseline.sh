#!/usr/bin/env bash
# The bits a refactor must not move: run the gate (and two RL steps) on every shipped contract and
# print one line per digest (logprob bit patterns per rollout TP and trainer layout, the trainer's
# weights after each step). Run it before and after a change and diff the two outputs.
#   bash tools/bits_baseline.sh OUT_DIR      (about 20 minutes on a 2-core machine)
set -euo pipefail
out=${1:?usage: bits_baseline.sh OUT_DIR}
mkdir -p "$out"
cg=${CONTRACTGEN:-.venv/bin/contractgen}
for c in $(ls contracts/*.yaml | xargs -n1 basename | sed 's/\.yaml$//'); do
  "$cg" parity --contract "$c" --no-reference --quiet --json "$out/$c.gate.json" >/dev/null \
    || echo "gate failed: $c" >&2
done
for c in qwen3_dense_true_on_policy_v1 qwen3_dense_lora_true_on_policy_v1; do
  "$cg" parity --contract "$c" --no-reference --quiet --trainers fsdp --layouts fsdp1,fsdp2 \
    --json "$out/$c.fsdp.json" >/dev/null || echo "fsdp gate failed: $c" >&2
done
for run in megatron:tp1,tp2,pp2 fsdp:fsdp1,fsdp2; do
  "$cg" parity --contract qwen3_dense_true_on_policy_v1 --no-reference --quiet \
    --trainers "${run%%:*}" --layouts "${run#*:}" --train-steps 2 \
    --json "$out/train_${run%%:*}.json" >/dev/null || echo "train failed: $run" >&2
done
.venv/bin/python - "$out" <<'PY'
import json, sys
from pathlib import Path

def walk(node, path):
    if isinstance(node, dict):
        for k, v in sorted(node.items()):
            yield from walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            name = v.get("name", i) if isinstance(v, dict) else i
            yield from walk(v, f"{path}[{name}]")
    elif isinstance(node, str) and len(node) == 64 and all(c in "0123456789abcdef" for c in node):
        yield path, node

for f in sorted(Path(sys.argv[1]).glob("*.json")):
    for path, digest in walk(json.loads(f.read_text()), f.stem):
        print(path, digest[:16])
PY
