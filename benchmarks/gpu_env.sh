# Sourced by the benchmarks/gpu_*_session.sh scripts on the lent H200 machine: environment, then
# megatron-core, pydantic and their deps from the cp312 wheels in .whl/ (no internet there) and
# this checkout in editable mode; the versions go to $OUT/env.txt. The wheels (cp312, no deps):
#   pip download --dest .whl --only-binary=:all: --python-version 3.12 --no-deps \
#     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any \
#     megatron-core==0.16.1 pydantic pydantic-core annotated-types typing-inspection \
#     typing_extensions jsonschema jsonschema-specifications referencing rpds-py attrs click \
#     pyyaml jinja2 markupsafe peft==0.21.2 accelerate psutil pytest pluggy iniconfig \
#     pytest-xdist execnet hypothesis sortedcontainers
# (pytest-xdist because pyproject's addopts run the tests on two workers.)
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
{ nvidia-smi -L; python3 -c 'import torch, transformers, megatron.core as m; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "megatron-core", m.__version__)'; } | tee "$OUT/env.txt"
