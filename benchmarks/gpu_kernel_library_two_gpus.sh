#!/usr/bin/env bash
# The kernel library on two GPUs (first run for issue 10 on 2x H200), from a copy of the worktree:
# gpu-marked kernel tests, the benchmark table (bench_kernels.py), on two GPUs the tree all-reduce
# vs NCCL (bench_allreduce.py), the parity gate on CUDA.
# Expects the cp312 wheels (megatron-core, pydantic, ...) in ${WHL:-.whl}/ and, optionally, a
# scratch copy of SGLang's tp_invariant_ops.py at $SGL (never committed). Writes under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
WHL=${WHL:-.whl}
SECTIONS=${SECTIONS:-attention,memory,rollout,linear}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$WHL"/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
{ nvidia-smi -L; python3 -c 'import torch, triton, megatron.core as m; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "megatron-core", m.__version__)'; } | tee "$OUT/env.txt"
[ -n "${TESTS:-1}" ] && timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels tests/sglang/test_sglang_cuda.py 2>&1 | tail -n 30 | tee "$OUT/gpu_tests.log"
SG=()
[ -n "${SGL:-}" ] && [ -f "$SGL" ] && SG=(--sglang "$SGL")
timeout "${BENCH_TIMEOUT:-330}" python3 benchmarks/bench_kernels.py --device cuda --sections "$SECTIONS" --ms "${MS:-1,16,64,4096,8192}" "${SG[@]}" \
  --json "$OUT/kernels_h200.json" 2>&1 | tee "$OUT/bench.log" | grep -v '^{'
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
if [ "$NGPU" -ge 2 ] && [ -n "${ALLREDUCE:-1}" ]; then
  timeout 120 python3 benchmarks/bench_allreduce.py --world 2 --json "$OUT/allreduce_tp2.json" 2>&1 | tail -n 12 | tee "$OUT/allreduce.log"
fi
LAYOUTS=${LAYOUTS:-tp1}
[ "$NGPU" -ge 2 ] && LAYOUTS=${LAYOUTS_2GPU:-tp1,tp2,pp2,cp2} && ROLLOUT_TPS=${ROLLOUT_TPS:-1,2}
timeout "${PARITY_TIMEOUT:-240}" contractgen parity --device cuda --contract qwen3_dense_true_on_policy_v1 \
  --layouts "$LAYOUTS" --rollout-tps "${ROLLOUT_TPS:-1}" --quiet --json "$OUT/parity_v1_cuda_triton.json" 2>&1 | tee "$OUT/parity.txt" | grep -v -i warn
