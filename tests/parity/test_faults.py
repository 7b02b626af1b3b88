"""Fault injection: breaking one policy field on one side breaks bitwise parity, and the
layer-dump comparator names where. Plus the full --inject-faults run (slow)."""

from __future__ import annotations

import pytest
from conftest import V1, V2, run_parity

from contractgen.parity.faults import Fault, catalogue, flipped
from contractgen.parity.harness import (
    GateConfig,
    GateRun,
    _retry_on_large_workload,
    _try_fault,
    compare,
    first_divergence,
)
from contractgen.parity.layouts import parse_layout

TP1 = parse_layout("tp1")


@pytest.fixture(scope="module")
def gate(reference_weights):
    _, weights = reference_weights
    with GateRun(GateConfig(V1, weights, [TP1], progress=False)) as run:
        yield run


def test_baseline_is_exact(gate):
    cmp = compare(gate.scored_rollout(gate.rollout(1)), gate.trainer(TP1)[0])
    assert cmp.exact and cmp.tokens_compared == 40


@pytest.mark.parametrize(
    "fault",
    [
        Fault("trainer", "kernel", "matmul_tile_order"),
        Fault("trainer", "kernel", "attention_kv_chunk"),
        Fault("rollout", "kernel", "rope_dtype"),
        Fault("trainer", "runtime", "cast_qk_norm_input_before_weight_mul"),
        Fault("rollout", "runtime", "disable_fused_qk_norm_mrope"),
    ],
    ids=lambda f: f.name,
)
def test_one_flipped_field_breaks_parity_inside_the_layers(gate, fault):
    outcome, how = _try_fault(gate, fault, TP1)
    assert outcome == "detected", how


def test_first_divergence_names_the_layer(gate):
    """A flipped K block changes the first layer's matmuls: the comparator points at layer 0."""
    from contractgen.adapters.megatron.trainer import TrainerFault

    fault = TrainerFault(kernel_policy={"matmul_k_block": 64})
    rollout = gate.scored_rollout(gate.rollout(1))
    trainer, _ = gate.trainer(TP1, fault=fault)
    cmp = compare(rollout, trainer)
    assert not cmp.exact and cmp.max_abs_diff > 0
    where = first_divergence(gate, TP1, cmp.first, trainer_fault=fault)
    assert set(where) == {"layer", "module", "token_index", "rollout", "trainer"}
    assert where["layer"] == 0 and where["module"] == "decoder.layers.0"
    assert where["rollout"] != where["trainer"]


def test_catalogue_covers_every_policy_field():
    from contractgen.codegen.vendored import load_target

    sg = load_target("sglang")
    mg = load_target("megatron")
    kp = sg.schema.kernel_policy_for(V1)
    faults = catalogue(kp, sg.runtime_policy.policy_for(V1), mg.runtime_policy.policy_for(V1))
    names = {f.name for f in faults}
    import dataclasses

    for field in dataclasses.fields(kp):
        if getattr(kp, field.name) is None:  # unset in this contract (a dense one's MoE fields)
            assert f"kernel.{field.name}@rollout" not in names
            continue
        assert f"kernel.{field.name}@rollout" in names and f"kernel.{field.name}@trainer" in names
    for f in faults:  # every fault changes its field's value
        owner = kp if f.kind == "kernel" else None
        if owner is not None:
            value = getattr(owner, f.field)
            assert flipped(f.field, value, f.kind) != value


def test_catalogue_flips_every_moe_field():
    """The MoE contract's kernel fields are all injected, each with a legal other value."""
    import dataclasses

    from contractgen.codegen.vendored import load_target

    moe = "qwen3_moe_true_on_policy_v1"
    sg, mg = load_target("sglang"), load_target("megatron")
    kp = sg.schema.kernel_policy_for(moe)
    faults = catalogue(kp, sg.runtime_policy.policy_for(moe), mg.runtime_policy.policy_for(moe))
    kernel = {f.field for f in faults if f.kind == "kernel"}
    # every field the contract sets (matmul_k_runs is fixed_runs' only: unset here)
    assert kernel == {f.name for f in dataclasses.fields(kp) if getattr(kp, f.name) is not None}
    assert kp.matmul_k_runs is None and "matmul_k_runs" not in kernel
    for name in sorted(n for n in kernel if n.startswith("moe_")):
        value = getattr(kp, name)
        assert flipped(name, value, "kernel") not in (value, None), name


VOCAB_BLOCK = [Fault(side, "kernel", "logsoftmax_vocab_block") for side in ("rollout", "trainer")]


def test_no_retry_when_the_run_is_already_large(reference_weights):
    """The second chance costs a run: it is skipped when nothing is left or the run's own
    workload is at least as large (no process starts here)."""
    from contractgen.parity.workload import WORKLOADS, make_workload

    _, weights = reference_weights
    large = make_workload(*WORKLOADS["large"])
    outcomes = {f.name: ("undetected", "") for f in VOCAB_BLOCK}
    with GateRun(GateConfig(V2, weights, [TP1], progress=False, workload=large)) as run:
        assert _retry_on_large_workload(run, VOCAB_BLOCK, TP1, outcomes) is None
    with GateRun(GateConfig(V2, weights, [TP1], progress=False)) as run:
        assert _retry_on_large_workload(run, [], TP1, outcomes) is None
    assert all(o == ("undetected", "") for o in outcomes.values())


@pytest.mark.slow
def test_v2_vocab_block_fault_is_seen_on_the_large_workload(reference_weights):
    """v2's float32 logprobs: a vocab block of 16 instead of 128 reorders the sum-exp and moves
    about 1 logprob in 25 by an ulp. On the default 40 tokens neither side's flip showed (the
    full v2 --inject-faults run, README); on the large workload's 256 both do. v1 rounds
    logprobs to bfloat16, which hides the same flip (it stays explained in v1's notes)."""
    _, weights = reference_weights
    outcomes = {f.name: ("undetected", "") for f in VOCAB_BLOCK}
    with GateRun(GateConfig(V2, weights, [TP1], progress=False)) as run:  # starts no process
        retried = _retry_on_large_workload(run, VOCAB_BLOCK, TP1, outcomes)
    assert retried is not None and retried["layout"] == "tp1" and retried["workload"] == "large"
    assert retried["detected"] == [f.name for f in VOCAB_BLOCK]
    for fault in VOCAB_BLOCK:
        outcome, how = outcomes[fault.name]
        assert outcome == "detected" and how.endswith("on the large workload"), how


@pytest.mark.slow
@pytest.mark.parametrize(
    "contract, layouts",
    [(V1, None), ("llama3_dense_true_on_policy_v1", "tp1,tp4")],
    ids=["qwen3_v1-default_layouts", "llama3-tp1_tp4"],
)
def test_inject_faults_every_fault_detected_or_explained(tmp_path, contract, layouts):
    """With no other flag, --inject-faults runs the layouts its faults need (tp4 included) and
    passes: every fault, the planted shared-kernel bugs included, detected or explained.

    The default contract at the default layouts, and Llama 3 (a second family: its QK-norm
    faults are explained by its contract's notes, since the family has no QK-norm) at tp1 and
    tp4 only, for CI time: every Llama 3 fault the six default layouts detect, these two detect
    too (44 of 56 both ways, 12 explained; measured 2026-12-02). v2's full run passes too (48
    detected, 2 of them on the large workload, 8 explained: README), but is not repeated here;
    its one new mechanism, the large-workload retry, is the test above."""
    extra = ("--layouts", layouts) if layouts else ()
    code, report, out = run_parity("--contract", contract, "--inject-faults", *extra,
                                   tmp_path=tmp_path)  # fmt: skip
    assert "tp4" in [lay["name"] for lay in report["layouts"]]
    faults = report["faults"]
    shared = {"shared.silu_glu_sign_flip", "shared.tp_reduce_skipped"}
    assert shared <= set(faults["details"]) and not shared & set(faults["explained"])
    assert faults["undetected"] == [], out
    assert faults["errors"] == {} and faults["contradicted"] == [], out
    assert faults["detected"] + len(faults["explained"]) == faults["injected"]
    assert code == 0, out
