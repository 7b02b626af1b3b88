"""The gate's parent process starts trainer sessions without importing megatron-core.

Only the ranks build a model; importing megatron-core in the parent as well cost every
``contractgen parity`` run about 4 s of wall time on this 2-core machine (11 s against 15 s for
the tiny tp1 gate, measured 2026-12-07). The check runs in a fresh interpreter, since the test
process may have imported megatron-core for other tests.
"""

from __future__ import annotations

import subprocess
import sys

PARENT = """
import sys
import contractgen.adapters.megatron as m
from contractgen.cli import main
from contractgen.parity import gate, harness
m.TrainerSession, m.TrainerFault, m.TrainerRun, m.TrainBatch
from contractgen.adapters.megatron.profile import arch_for
arch_for("qwen3_dense_true_on_policy_v1")
print(sorted(k for k in sys.modules if k.split(".")[0] == "megatron"))
"""


def test_the_gate_parent_imports_no_megatron_core():
    out = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True,
                         timeout=300, check=True)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout


def test_the_trainer_names_keep_their_old_homes():
    """``model.arch_for`` and ``policy.generated`` (imported by benchmarks and users' scripts)
    are the light module's functions, one cache."""
    from contractgen.adapters.megatron import model, policy, profile

    assert model.arch_for is profile.arch_for and model.checkpoint_arch is profile.checkpoint_arch
    assert policy.generated is profile.generated
    assert policy.model_profile_for is profile.model_profile_for
