"""Issue 13, Qwen3-MoE through the gate: rollout and trainer (megatron-core's ``MoELayer`` tree with
the contract's MoE kernels) agree bit for bit at TP1, TP2, PP2 and CP2 in one gate run, and
flipping an MoE kernel-policy field on the trainer side alone breaks that.

The model is the contract's reference model with one deliberate change: in every MoE layer the
router rows of experts 2 and 5 are equal, so their logits tie for every token and the tie-break
decides, whenever the pair straddles the top-k boundary, which of two different expert FFNs runs
(with the plain random weights no tie ever occurs and a flipped tie-break cannot show; measured:
undetected). ``moe_topk_normalisation`` and ``moe_combine_order`` change float32 ulps that the
contract's bfloat16 rounding hides on this model (measured: undetected here, also with 40 scored
tokens); ``tests/megatron/test_megatron_moe.py`` shows the trainer's MoE layer reading both under
float32 dtypes, where they do change its output."""

from __future__ import annotations

import pytest
from conftest import run_parity_in_process

from contractgen.parity.faults import Fault
from contractgen.parity.harness import GateConfig, GateRun, _try_fault, run_layouts
from contractgen.parity.layouts import parse_layouts
from contractgen.parity.workload import make_workload

MOE = "qwen3_moe_true_on_policy_v1"
MOE_V2 = "qwen3_moe_true_on_policy_v2"
LAYOUTS = parse_layouts("tp1,tp2,pp2,cp2")
TP1 = LAYOUTS[0]


def tied_router_weights():
    """The reference model's seeded random weights with router rows 2 and 5 made equal."""
    from contractgen.adapters.sglang.model import ModelArch, random_weights
    from contractgen.codegen.vendored import load_target

    arch = ModelArch.from_profile(load_target("sglang").schema.model_profile_for(MOE))
    weights = random_weights(arch, seed=0)
    routers = [name for name in weights if name.endswith("mlp.gate.weight")]
    assert len(routers) == 3  # layers 0, 2, 3 (layer 1 is dense: mlp_only_layers)
    for name in routers:
        weights[name][5] = weights[name][2]
    return weights


@pytest.fixture(scope="module")
def gates():
    """``gates(contract)``: that contract's gate run on the tied-router model (started on first
    use; one contract's processes alive at a time)."""
    runs: dict[str, GateRun] = {}
    weights = tied_router_weights()

    def gate_for(contract: str) -> GateRun:
        if contract not in runs:
            for run in runs.values():
                run.close()
            config = GateConfig(
                contract,
                weights,
                LAYOUTS,
                progress=False,
                hf_reference=False,
                workload=make_workload(requests=2, prompt_tokens=12, new_tokens=3),
            )
            runs[contract] = GateRun(config)
        return runs[contract]

    yield gate_for
    for run in runs.values():
        run.close()


@pytest.fixture
def gate(gates):
    return gates(MOE)


@pytest.mark.parametrize(
    "field", ["moe_router_logits_dtype", "moe_topk_tie_break"], ids=lambda f: f"kernel.{f}@trainer"
)
def test_one_flipped_moe_field_on_the_trainer_breaks_parity(gate, field):
    outcome, how = _try_fault(gate, Fault("trainer", "kernel", field), TP1)
    assert outcome == "detected", how


@pytest.mark.parametrize("contract", [MOE, MOE_V2])
def test_moe_gate_is_exact_at_every_layout(gates, contract):
    """One gate run over the four layouts (``run_layouts``, as ``contractgen parity`` runs them):
    every layout's trainer logprobs ``torch.equal`` the rollout's logprobs the contract names
    (v1: the prefill re-score in bfloat16; v2: the decode-step logprobs in float32)."""
    gate = gates(contract)
    assert gate.logprob_contract == {MOE: "sglang_prefill", MOE_V2: "decode"}[contract]
    report = run_layouts(gate)
    layouts = report["layouts"]
    assert [lay["name"] for lay in layouts] == ["tp1", "tp2", "pp2", "cp2"]
    assert all(lay["exact"] and lay["max_abs_diff"] == 0 for lay in layouts), layouts
    assert all(lay["tokens_compared"] == 6 for lay in layouts), layouts
    assert report["pairs"] and all(p["exact"] for p in report["pairs"]), report["pairs"]


def test_a_side_without_the_moe_block_is_refused_with_one_line(monkeypatch, tmp_path):
    """The gate's check that both sides implement every MLP block the contract's models have
    (what ``parity`` on this contract did before the trainer side existed): exit 2, one line."""
    import contractgen.adapters.megatron as trainer_side

    monkeypatch.setattr(trainer_side, "MLP_BLOCKS", frozenset({"dense_mlp"}))
    code, report, out = run_parity_in_process("--contract", MOE, tmp_path=tmp_path)
    assert code == 2 and report is None and "Traceback" not in out, out
    assert [ln for ln in out.splitlines() if ln.startswith("error:")] == [
        f"error: {MOE}: the trainer side (megatron) is not implemented yet for the moe block of "
        "qwen3_moe models (it implements: dense_mlp); parity needs both sides"
    ]
