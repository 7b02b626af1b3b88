"""v4 (one float32 dot for every column-parallel matmul and the LM head; v3's 8 runs and float32
tree for the row-parallel ones) under the gate on CPU: exact between the rollout and the trainer
at TP=1 and at a TP split of the row-parallel K, and one flipped run count on one side breaks it
(the column count on the rollout, the row count on the trainer). The full --inject-faults run is
BENCHMARKS.md's; the gate on CUDA too."""

from __future__ import annotations

import pytest
from contract_gates import assert_layouts_equal_the_tp1_rollout, reference_gate

from contractgen.parity.faults import Fault
from contractgen.parity.harness import GateConfig, GateRun, _try_fault
from contractgen.parity.layouts import parse_layout

V4 = "qwen3_dense_true_on_policy_v4"
TP1, TP2 = parse_layout("tp1"), parse_layout("tp2")


@pytest.fixture(scope="module")
def gate():
    with reference_gate(V4, [TP1, TP2]) as run:
        yield run


def test_v4_rollout_and_trainer_agree_at_tp1_and_tp2(gate):
    assert_layouts_equal_the_tp1_rollout(gate, [TP1, TP2])


@pytest.mark.parametrize(
    "fault",
    [
        Fault("rollout", "kernel", "matmul_column_k_runs"),
        Fault("trainer", "kernel", "matmul_column_k_runs"),
        Fault("trainer", "kernel", "matmul_k_runs"),
    ],
    ids=lambda f: f.name,
)
def test_one_flipped_run_count_breaks_v4_parity(gate, fault):
    outcome, how = _try_fault(gate, fault, TP1)
    assert outcome == "detected", how


@pytest.mark.slow
def test_a_cross_rank_rollout_fault_gets_its_second_chance_at_the_largest_rollout_tp():
    """``sglang.disable_reduce_scatter`` under v4: the reduce-scatter's float32 order differs
    from the tree's only in a last bit, which the one rounding to bfloat16 shows where the two
    sums straddle a rounding boundary; no layout of the default workload met one (the full
    --inject-faults run, BENCHMARKS.md). The retry on the large workload at the rollout's TP 4
    does; at TP 1, where the old retry ran, the switch does not act at all (the twin)."""
    from contractgen.adapters.sglang.model import ModelArch, random_weights
    from contractgen.codegen.vendored import load_target
    from contractgen.parity.harness import _retry_on_large_workload

    arch = ModelArch.from_profile(load_target("sglang").schema.model_profile_for(V4))
    fault = [Fault("rollout", "runtime", "disable_reduce_scatter")]
    weights = random_weights(arch, seed=0)
    for tps, want in (([1, 4], "detected"), ([1], "undetected")):
        outcomes = {fault[0].name: ("undetected", "")}
        config = GateConfig(V4, weights, [TP1], progress=False, rollout_tps=tps)
        with GateRun(config) as run:  # starts no process
            retried = _retry_on_large_workload(run, fault, TP1, outcomes)
        assert retried is not None and retried["rollout_tps"] == tps
        outcome, how = outcomes[fault[0].name]
        assert outcome == want, (tps, how)
        if want == "detected":
            assert "with rollout tp4" in how and how.endswith("on the large workload"), how
