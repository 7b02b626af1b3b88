"""Issue 32: the fixed_runs numerics of qwen3_dense_true_on_policy_v3 (float32 runs, a float32
tree over runs and TP ranks, one rounding) in the Llama 3 contract (llama3_dense_true_on_policy_v2)
and the Qwen3-MoE one (qwen3_moe_true_on_policy_v3), under the gate on CPU: exact between the
rollout and the trainer where TP splits the row-parallel K (MoE: the experts' down_proj too, and
under expert parallelism, where a rank holds whole experts), and one flipped matmul field on one
side breaks it. The full --inject-faults runs pass too (README, benchmarks/results); this is the
same check as tests/parity/test_v3_fixed_runs.py for dense v3."""

from __future__ import annotations

import pytest
from contract_gates import assert_layouts_equal_the_tp1_rollout, reference_gate

from contractgen.parity.faults import Fault
from contractgen.parity.harness import _try_fault
from contractgen.parity.layouts import parse_layout

# Slow: on the shared 2-core CPU (load ~9) the gate's start took 480 s and a rollout-side fault
# up to 63 s; the whole file passed in 719 s.
pytestmark = pytest.mark.slow

LLAMA_V2 = "llama3_dense_true_on_policy_v2"
MOE_V3 = "qwen3_moe_true_on_policy_v3"
TP1, TP2, EP2 = parse_layout("tp1"), parse_layout("tp2"), parse_layout("ep2")


@pytest.fixture(scope="module")
def llama_gate():
    with reference_gate(LLAMA_V2, [TP1, TP2]) as run:
        yield run


@pytest.fixture(scope="module")
def moe_gate():
    with reference_gate(MOE_V3, [TP1, TP2, EP2]) as run:
        yield run


def test_llama3_v2_rollout_tp2_and_trainer_tp2_equal_tp1(llama_gate):
    """The trainer at TP=2 (each rank 4 of the 8 runs of o_proj's and down_proj's K) and the
    rollout at TP=2 give the TP=1 rollout's logprobs bit for bit (the prefill re-score: v1's
    logprob contract)."""
    assert_layouts_equal_the_tp1_rollout(llama_gate, [TP1, TP2])


def test_moe_v3_rollout_tp2_and_trainer_tp2_ep2_equal_tp1(moe_gate):
    """TP=2 splits the experts' down_proj K (512: 4 of 8 runs per rank) as well as the dense
    layer's and o_proj's; EP=2 gives each rank whole experts (all 8 runs). Both trainer layouts
    and the TP=2 rollout equal the TP=1 rollout bit for bit."""
    assert_layouts_equal_the_tp1_rollout(moe_gate, [TP1, TP2, EP2])


FAULTS = [
    Fault("trainer", "kernel", "matmul_k_runs"),
    Fault("rollout", "kernel", "matmul_tile_order"),
    Fault("trainer", "kernel", "matmul_accumulation_dtype"),
    Fault("rollout", "kernel", "matmul_k_block"),
]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_one_flipped_matmul_field_breaks_llama3_v2_parity(llama_gate, fault):
    outcome, how = _try_fault(llama_gate, fault, TP1)
    assert outcome == "detected", how


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_one_flipped_matmul_field_breaks_moe_v3_parity(moe_gate, fault):
    """The router and the experts run the same fixed_runs matmul (kernels/moe.py passes the
    policy's run count to the router); a flip on one side is detected."""
    outcome, how = _try_fault(moe_gate, fault, TP1)
    assert outcome == "detected", how
