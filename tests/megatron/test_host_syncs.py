"""No host sync per layer on the trainer's forward + backward (issue 32).

``host_sync_probe`` counts the Python calls that become host syncs on CUDA (a tensor's value read
on the host, value-sized outputs, tensors built from Python data) in one forward with grad, the
contract's vocab-parallel log-softmax and the backward of a tiny model, at two depths: what one
layer adds is the difference. On the Triton path (Triton's interpreter on CPU: the same wrappers
the CUDA run calls) a layer adds none; the step makes a fixed three, the attention kernels' block
tables built once per pack (forward one table, backward two; later layers reuse them). The twin
drops the pack's host-side contiguity flags, as the params carried none before: the backward
then checks positions on the device, one ``__bool__`` per layer, and the count sees every one.
On the CPU reference (the default backend) the trainer's own code makes none; the calls it sees
are the reference attention's loop bounds (``adapters/kernels/attention.py``), a CPU path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from host_sync_probe import probe

V1 = "qwen3_dense_true_on_policy_v1"
V3 = "qwen3_dense_true_on_policy_v3"
PROBE = Path(__file__).with_name("host_sync_probe.py")
# the attention kernels' block tables: ``torch.tensor`` copies once per pack, not per layer
PER_STEP = {"forward": {"torch.tensor": 1}, "backward": {"torch.tensor": 2}}


def _probe_triton(contract: str, *args: str) -> list[dict]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "CONTRACTGEN_KERNEL_BACKEND": "triton"}
    out = subprocess.run(
        [sys.executable, str(PROBE), contract, *args],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


# v3 only under the interpreter (v1's run took 39 s of the suite's 30 minutes): the two differ in
# the matmul's reduction schedule alone, and both run the same orchestration and small-op
# kernels; v1's trainer code is checked for host syncs on the CPU reference below.
@pytest.mark.parametrize("contract", [V3])
def test_triton_path_makes_no_host_sync_per_layer(contract):
    one, two, twin = _probe_triton(contract, "1", "2", "--twin", "--short")
    for phase in ("forward", "backward"):
        assert one[phase] == two[phase] == PER_STEP[phase], (phase, one, two)
    # twin: without the host-side flags the backward checks positions on the device, once per
    # layer (two layers: two), and the count sees them; the flags change no bit
    assert twin["twin"] and twin["backward"].get("__bool__") == 2, twin
    assert twin["same_bits"]


@pytest.mark.parametrize("contract", [V1, V3])
def test_trainer_code_makes_no_host_sync_on_the_cpu_reference(contract):
    one, two = (probe(contract, d, (20, 9)) for d in (1, 2))
    for r in (one, two):
        assert not any(c.startswith("adapters/megatron/") for c in r["callers"]), r["callers"]
        # what there is: the reference attention's per-sequence loop bounds (CPU path)
        assert set(r["callers"]) <= {"adapters/kernels/attention.py"}, r["callers"]
