"""Suite-wide setup that must happen before any test module imports the kernel library."""

from __future__ import annotations

import os
import shutil

# Triton reads TRITON_INTERPRET when a kernel is defined (at import of
# contractgen.adapters.kernels.triton), and any earlier test may import it. Without a GPU, the
# interpreter runs the Triton kernels on CPU tensors (tests/kernels/test_triton_kernels.py).
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (pyproject's addopts run two workers) each worker computes on one thread:
# two workers with two OpenMP threads each, plus the rank processes they fork, oversubscribe two
# cores, and the spinning threads cost more than they give (two gate files measured 227 s of
# wall time with the default threads against 180 s with one). Set before torch is imported.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, "1")
