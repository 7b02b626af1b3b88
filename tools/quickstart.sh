#!/usr/bin/env bash
# The README's first command: install what is missing into .venv (tools/install-dev.sh), then run
# the gate (contractgen check, then the exact-zero parity gate on the shipped v1 contract).
# Safe to re-run: an already complete .venv is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "quickstart: $PY not found; install Python 3.11 (or set PYTHON=/path/to/python3.11)" >&2
    exit 2
fi
if [ ! -x .venv/bin/python ] && ! "$PY" -m venv --help >/dev/null 2>&1; then
    echo "quickstart: '$PY -m venv' is unavailable; on Debian/Ubuntu: apt-get install python3-venv" >&2
    exit 2
fi
# sglang is installed without its dependencies (only its argument parser is used): look it up,
# do not import it.
if .venv/bin/python -c "import contractgen, torch, megatron.core, pytest, importlib.util as u; \
assert u.find_spec('sglang')" >/dev/null 2>&1 \
    && [ -x .venv/bin/contractgen ] && [ -x .venv/bin/ruff ]; then
    echo "quickstart: .venv is complete ($(.venv/bin/contractgen --version))"
else
    PYTHON="$PY" bash tools/install-dev.sh
fi
.venv/bin/contractgen check
.venv/bin/contractgen parity
