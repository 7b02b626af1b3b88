"""Issue 13: until the trainer side has an MoE block, ``parity`` on the Qwen3-MoE contract exits 2
with one line saying so (no traceback, no worker started)."""

from __future__ import annotations

import subprocess
import sys


def test_moe_parity_exits_2_until_the_trainer_side_exists() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "contractgen", "parity", "--contract", "qwen3_moe_true_on_policy_v1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0] == (
        "error: qwen3_moe_true_on_policy_v1: the trainer side (megatron) is not implemented yet "
        "for the moe block of qwen3_moe models (it implements: dense_mlp); parity needs both sides"
    )
