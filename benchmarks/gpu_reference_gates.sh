#!/usr/bin/env bash
# The gate WITH the transformers check (no --no-reference) on CUDA for the contracts shipped
# by 2026-12-03: the default tiny model, the Qwen3-0.6B shape (dense v1 and v2), the Llama-3.2-1B
# shape (Llama 3 v1) and the MoE reference model (v1 and v2); plus the gpu tests of the float32
# routing and of transformers agreement on CUDA. First run for issue 31 on an H200. Expects the
# cp312 wheels in .whl/ (gpu_env.sh); writes the JSON reports and one log under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
log="$OUT/reference_session.log"
cat "$OUT/env.txt" >>"$log" && rm -f "$OUT/env.txt" "$OUT/install.log"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_triton_kernels.py \
  -k "float32_operands" 2>&1 | tail -n 5 | tee -a "$log"
gate() {  # name, then parity arguments
  local name=$1; shift
  local t0=$SECONDS
  timeout 150 contractgen parity --device cuda --layouts tp1 --rollout-tps 1 --quiet \
    --json "$OUT/parity_${name}_cuda.json" "$@" 2>&1 | grep -v -i warn | tail -n 20 >>"$log"
  echo "== $name: exit ${PIPESTATUS[0]}, $((SECONDS - t0)) s" | tee -a "$log"
}
gate tiny_v1
gate moe_v1 --contract qwen3_moe_true_on_policy_v1
gate moe_v2 --contract qwen3_moe_true_on_policy_v2
gate qwen3_0.6b_v1 --model Qwen3-0.6B --requests 8 --new-tokens 128
gate qwen3_0.6b_v2 --contract qwen3_dense_true_on_policy_v2 --model Qwen3-0.6B --requests 8 --new-tokens 128
gate llama3.2_1b_v1 --contract llama3_dense_true_on_policy_v1 --model Llama-3.2-1B --requests 8 --new-tokens 128
python3 - "$OUT" <<'PY' | tee -a "$log"
import json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("parity_*_cuda.json")):
    r = json.loads(p.read_text())
    ref = r.get("reference") or {}
    worst = {e["name"]: e["max_abs_diff"] for e in ref.get("per_layout", [])}
    print(p.name, "reference within tolerance:", ref.get("within_tolerance"), worst)
PY
