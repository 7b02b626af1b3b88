"""v3 (fixed_runs: float32 runs, a float32 tree over runs and TP ranks, one rounding) under the
gate on CPU: exact between the rollout and the trainer at a TP split of the row-parallel K, and
one flipped matmul field on one side breaks it. The full --inject-faults run of v3 passes too
(README); the gate on CUDA is BENCHMARKS.md's."""

from __future__ import annotations

import pytest
from contract_gates import assert_layouts_equal_the_tp1_rollout, reference_gate

from contractgen.parity.faults import Fault
from contractgen.parity.harness import _try_fault
from contractgen.parity.layouts import parse_layout

V3 = "qwen3_dense_true_on_policy_v3"
TP1, TP2 = parse_layout("tp1"), parse_layout("tp2")


@pytest.fixture(scope="module")
def gate():
    with reference_gate(V3, [TP1, TP2]) as run:
        yield run


def test_v3_rollout_tp2_and_trainer_tp2_equal_tp1(gate):
    """The trainer at TP=2 (each rank 4 of the 8 runs of o_proj's and down_proj's K) and the
    rollout at TP=2 give the TP=1 rollout's logprobs bit for bit."""
    assert_layouts_equal_the_tp1_rollout(gate, [TP1, TP2])


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
