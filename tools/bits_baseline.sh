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
  "$cg" parity --contract "$c" --no-reference --quiet --trainers "$(
    .venv/bin/python -c "from contractgen.parity.targets import trainer_targets as t; print(','.join(t('$c')))")" \
    --json "$out/$c.gate.json" >/dev/null || echo "gate failed: $c" >&2
done
for t in megatron fsdp; do
  "$cg" parity --contract qwen3_dense_true_on_policy_v1 --no-reference --quiet --trainers "$t" \
    --train-steps 2 --json "$out/train_$t.json" >/dev/null || echo "train failed: $t" >&2
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
