"""v3 (fixed_runs: float32 runs, a float32 tree over runs and TP ranks, one rounding) under the
gate on CPU: exact between the rollout and the trainer at a TP split of the row-parallel K, and
one flipped matmul field on one side breaks it. The full --inject-faults run of v3 passes too
(README); the gate on CUDA is BENCHMARKS.md's."""

from __future__ import annotations

import pytest

from contractgen.parity.faults import Fault
from contractgen.parity.harness import GateConfig, GateRun, _try_fault, compare
from contractgen.parity.layouts import parse_layout

V3 = "qwen3_dense_true_on_policy_v3"
TP1, TP2 = parse_layout("tp1"), parse_layout("tp2")


@pytest.fixture(scope="module")
def gate():
    from contractgen.adapters.sglang.model import ModelArch, random_weights
    from contractgen.codegen.vendored import load_target

    arch = ModelArch.from_profile(load_target("sglang").schema.model_profile_for(V3))
    with GateRun(GateConfig(V3, random_weights(arch, seed=0), [TP1, TP2], progress=False)) as run:
        yield run


def test_v3_rollout_tp2_and_trainer_tp2_equal_tp1(gate):
    """The trainer at TP=2 (each rank 4 of the 8 runs of o_proj's and down_proj's K) and the
    rollout at TP=2 give the TP=1 rollout's logprobs bit for bit."""
    rollout = gate.scored_rollout(gate.rollout(1))
    for layout in (TP1, TP2):
        cmp = compare(rollout, gate.trainer(layout)[0])
        assert cmp.exact and cmp.tokens_compared == 40, layout
    cmp = compare(gate.scored_rollout(gate.rollout(2)), gate.trainer(TP1)[0])
    assert cmp.exact


@pytest.mark.parametrize(
    "fault",
    [
        Fault("trainer", "kernel", "matmul_k_runs"),
        Fault("rollout", "kernel", "matmul_tile_order"),
        Fault("trainer", "kernel", "matmul_accumulation_dtype"),
        Fault("rollout", "kernel", "matmul_k_block"),
    ],
    ids=lambda f: f.name,
)
def test_one_flipped_matmul_field_breaks_v3_parity(gate, fault):
    outcome, how = _try_fault(gate, fault, TP1)
    assert outcome == "detected", how
