#!/usr/bin/env bash
# Create .venv and install contractgen with everything its tests need (CPU only, nothing else
# downloaded at run time). Used by the README quickstart and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned: this exact CPU build is what the project is tested with; a looser
# requirement would let pip pick a multi-GB CUDA build.
.venv/bin/python -m pip install -q "torch==2.13.0"
# setuptools prints an "Editable installation" box for every editable install of a package
# whose folders are mapped (pyproject package-dir); it is information only
export PYTHONWARNINGS="ignore::UserWarning:setuptools.command.editable_wheel"
.venv/bin/python -m pip install -q -e ".[dev]"  # test deps, peft (the LoRA reference) among them
# sglang's pure-Python argument parser, to check rendered server args against the real release.
# --no-deps: sglang's own pins (CUDA torch, kernels) cannot be installed here; the light modules
# server_args imports come from the sglang-args extra.
.venv/bin/python -m pip install -q -e ".[sglang-args]"
.venv/bin/python -m pip install -q --no-deps "sglang==0.5.23"
echo "installed: $(.venv/bin/contractgen --version)"
