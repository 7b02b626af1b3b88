#!/usr/bin/env bash
# Real-shape parity on the lent H200 machine (issue 10; see BENCHMARKS.md): a random-weight
# checkpoint shaped like $MODEL (benchmarks/random_checkpoint.py, transformers' own init), then
# `contractgen parity --device cuda` at $LAYOUTS x rollout TPs $ROLLOUT_TPS (default 1,2) on $REQUESTS requests x
# $NEW_TOKENS new tokens. GPU_TESTS=1 first runs the gpu-marked tests. Expects megatron-core and
# pydantic (and their deps) as cp312 wheels in .whl/; writes logs and JSON reports under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
MODEL=${MODEL:-Qwen3-0.6B}
LAYOUTS=${LAYOUTS:-tp1,tp2,pp2,cp2}
REQUESTS=${REQUESTS:-8}
NEW_TOKENS=${NEW_TOKENS:-128}
ROLLOUT_TPS=${ROLLOUT_TPS:-1,2}
TAG=$(echo "$MODEL" | tr 'A-Z.' 'a-z_')
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
{ nvidia-smi -L; python3 -c 'import torch, transformers, megatron.core as m; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "megatron-core", m.__version__)'; } | tee "$OUT/env.txt"
if [ -n "${GPU_TESTS:-}" ]; then
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/sglang tests/megatron tests/kernels 2>&1 \
    | tail -n 25 | tee "$OUT/gpu_tests.log"
fi
timeout 240 python3 benchmarks/random_checkpoint.py --name "$MODEL" --out "/tmp/ckpt_$TAG" \
  2>&1 | tee "$OUT/checkpoint_$TAG.txt"
/usr/bin/time -f "%e s wall, %M KB peak RSS (parent)" timeout "${BIG_TIMEOUT:-420}" contractgen parity \
  --device cuda --checkpoint "/tmp/ckpt_$TAG" --layouts "$LAYOUTS" --rollout-tps "$ROLLOUT_TPS" \
  --requests "$REQUESTS" --new-tokens "$NEW_TOKENS" --no-reference --json "$OUT/parity_${TAG}_cuda.json" \
  2>&1 | grep -v -i warn | tee "$OUT/parity_${TAG}_cuda.txt"
