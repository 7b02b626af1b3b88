#!/usr/bin/env bash
# `contractgen parity --train-steps` on the lent 2x H200 machine (see BENCHMARKS.md): the tiny
# reference model, then a random-weight Qwen3-0.6B-shaped checkpoint, 5 RL steps each, trainer
# tp1 and tp2 x rollout TP 1 and 2, NCCL. Expects megatron-core and pydantic (and their deps) as
# cp312 wheels in .whl/; writes logs and JSON reports under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
STEPS=${STEPS:-5}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
{ nvidia-smi -L; python3 -c 'import torch, transformers, megatron.core as m; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "megatron-core", m.__version__)'; } | tee "$OUT/env.txt"
if [ -z "${SKIP_TINY:-}" ]; then
  timeout 150 contractgen parity --device cuda --train-steps "$STEPS" --layouts tp1,tp2 \
    --rollout-tps 1,2 --json "$OUT/train_tiny_cuda.json" 2>&1 | grep -v -i warn | tee "$OUT/train_tiny_cuda.txt"
fi
timeout 90 python3 benchmarks/random_checkpoint.py --name Qwen3-0.6B --out /tmp/qwen3-0.6b-random \
  2>&1 | tee "$OUT/checkpoint.txt"
timeout "${BIG_TIMEOUT:-290}" contractgen parity --device cuda --checkpoint /tmp/qwen3-0.6b-random \
  --train-steps "$STEPS" --layouts tp1,tp2 --rollout-tps 1,2 --json "$OUT/train_qwen3_0.6b_cuda.json" \
  2>&1 | grep -v -i warn | tee "$OUT/train_qwen3_0.6b_cuda.txt"
