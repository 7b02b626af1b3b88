"""Suite-wide setup that must happen before any test module imports the kernel library."""

from __future__ import annotations

import os
import shutil

# Triton reads TRITON_INTERPRET when a kernel is defined (at import of
# contractgen.adapters.kernels.triton), and any earlier test may import it. Without a GPU, the
# interpreter runs the Triton kernels on CPU tensors (tests/kernels/test_triton_kernels.py).
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")


# The longest tests (measured with --durations; each minutes on the 2-core CI machine), longest
# first. Under ``-n 2 --dist worksteal`` a worker that runs out of tests takes over the other's
# queue, so the suite ends when its last long test does: starting them first leaves only short
# tests for the end. Without xdist the order changes nothing but the order.
LONGEST_FIRST = (
    "tests/parity/test_faults.py::test_inject_faults_every_fault_detected_or_explained",
    "tests/parity/test_gate_cli.py::test_default_gate_is_exact_at_every_default_layout",
    "tests/parity/test_llama3_gate.py::test_llama3_gate_is_exact",
)


def pytest_collection_modifyitems(config, items):
    rank = {nodeid: i for i, nodeid in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("[", 1)[0], len(rank)))
