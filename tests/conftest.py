"""Suite-wide setup that must happen before any test module imports the kernel library."""

from __future__ import annotations

import os
import shutil

# Triton reads TRITON_INTERPRET when a kernel is defined (at import of
# contractgen.adapters.kernels.triton), and any earlier test may import it. Without a GPU, the
# interpreter runs the Triton kernels on CPU tensors (tests/kernels/test_triton_kernels.py).
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
