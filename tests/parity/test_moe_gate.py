"""Issue 13, Qwen3-MoE through the gate: rollout and trainer (megatron-core's ``MoELayer`` tree with
the contract's MoE kernels) agree bit for bit at TP1, TP2, PP2, CP2, EP2 (two attention-DP ranks,
four whole experts each) and TP2 x EP2 (experts over the TP ranks) in one gate run, for v1 and
v2, and flipping an MoE kernel-policy field on the trainer side alone breaks that.

The model is the contract's reference model as ``contractgen parity`` builds it: its
``tied_router_experts: [2, 5]`` makes the router rows of experts 2 and 5 equal in every MoE layer,
so their logits tie for every token and the tie-break decides, whenever the pair straddles the
top-k boundary, which of two different expert FFNs runs (with untied random rows no tie occurs
and a flipped tie-break cannot show; measured: undetected). ``moe_topk_normalisation`` and
``moe_combine_order`` change float32 ulps that the contract's bfloat16 rounding hides on this
model (the contract's ``unobservable`` notes say so); ``tests/megatron/test_megatron_moe.py``
shows the trainer's MoE layer reading both under float32 dtypes, where they do change its
output."""

from __future__ import annotations

import pytest
import torch
from conftest import run_parity, run_parity_in_process

from contractgen.parity.faults import Fault
from contractgen.parity.harness import GateConfig, GateRun, _try_fault, run_layouts
from contractgen.parity.layouts import parse_layouts
from contractgen.parity.workload import make_workload

MOE = "qwen3_moe_true_on_policy_v1"
MOE_V2 = "qwen3_moe_true_on_policy_v2"
LAYOUTS = parse_layouts("tp1,tp2,pp2,cp2,ep2,tp2ep2")
TP1 = LAYOUTS[0]


def reference_weights():
    """The contract's reference model's seeded random weights (what ``parity`` builds)."""
    from contractgen.adapters.sglang.model import ModelArch, random_weights
    from contractgen.codegen.vendored import load_target

    arch = ModelArch.from_profile(load_target("sglang").schema.model_profile_for(MOE))
    return random_weights(arch, seed=0)


def test_reference_model_ties_router_rows_2_and_5():
    """``tied_router_experts: [2, 5]``: in each MoE layer (0, 2, 3; layer 1 is dense) router row 5
    is row 2, and no other two rows are equal."""
    weights = reference_weights()
    routers = sorted(name for name in weights if name.endswith("mlp.gate.weight"))
    assert [name.split(".")[2] for name in routers] == ["0", "2", "3"]
    pairs = [(a, b) for a in range(8) for b in range(a + 1, 8)]
    for name in routers:
        w = weights[name]
        assert [(a, b) for a, b in pairs if torch.equal(w[a], w[b])] == [(2, 5)], name


def test_transformers_reference_breaks_router_ties_to_the_lowest_id():
    """Inside ``ties_to_lowest_index`` ``torch.topk`` returns the lowest index of equal values
    first (stock CPU ``torch.topk`` returns the higher one for some of these rows) and selects
    what stock ``torch.topk`` selects where nothing ties; outside it is stock again."""
    from contractgen.parity.reference import ties_to_lowest_index

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 8, generator=g)
    x[:, 5] = x[:, 2]
    stock = torch.topk(x, 4).indices
    with ties_to_lowest_index():
        ours = torch.topk(x, 4)
        untied = torch.topk(x[:, :5], 3)
    straddle = (stock == 5).any(-1) & ~(stock == 2).any(-1)
    assert straddle.any()  # the stock op picked 5 over its equal 2 somewhere
    assert not ((ours.indices == 5).any(-1) & ~(ours.indices == 2).any(-1)).any()
    assert torch.equal(ours.values, torch.topk(x, 4).values)
    assert torch.equal(untied.indices, torch.topk(x[:, :5], 3).indices)


@pytest.fixture(scope="module")
def gates():
    """``gates(contract)``: that contract's gate run on the tied-router model (started on first
    use; one contract's processes alive at a time)."""
    runs: dict[str, GateRun] = {}
    weights = reference_weights()

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
    """One gate run over the six layouts (``run_layouts``, as ``contractgen parity`` runs them):
    every layout's trainer logprobs ``torch.equal`` the rollout's logprobs the contract names
    (v1: the prefill re-score in bfloat16; v2: the decode-step logprobs in float32)."""
    gate = gates(contract)
    assert gate.logprob_contract == {MOE: "sglang_prefill", MOE_V2: "decode"}[contract]
    report = run_layouts(gate)
    layouts = report["layouts"]
    assert [lay["name"] for lay in layouts] == ["tp1", "tp2", "pp2", "cp2", "ep2", "tp2ep2"]
    assert [lay["ep"] for lay in layouts] == [1, 1, 1, 1, 2, 2]
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


def test_training_refuses_ep_layouts_with_one_line(tmp_path):
    """EP runs the forward only: ``--train-steps`` with an EP layout exits 2 before any work."""
    code, report, out = run_parity_in_process(
        "--contract", MOE, "--layouts", "tp1,ep2", "--train-steps", "1", tmp_path=tmp_path
    )
    assert code == 2 and report is None and "Traceback" not in out, out
    assert [ln for ln in out.splitlines() if ln.startswith("error:")] == [
        "error: --layouts ep2: expert parallelism runs the forward only (the token exchange has "
        "no backward yet); --train-steps needs EP 1 layouts"
    ]


def test_every_moe_field_fault_is_detected_or_explained_by_the_contract():
    """``--inject-faults`` for the MoE fields alone, in the suite (the whole run takes 720 s):
    each MoE kernel field flipped on each side, on the default workload, at tp1 (and, for the
    EP-only ``moe_ep_combine``, at ep2), is detected exactly when the contract has no
    ``unobservable`` note for it, as ``run_faults`` requires."""
    from contractgen.codegen.vendored import load_target
    from contractgen.parity.harness import unobservable_notes
    from contractgen.parity.workload import DEFAULT_WORKLOAD

    kp = load_target("sglang").schema.kernel_policy_for(MOE)
    fields = [f for f in vars(kp) if f.startswith("moe_")]
    notes = unobservable_notes(MOE)
    tp1, ep2 = parse_layouts("tp1,ep2")
    config = GateConfig(
        MOE, reference_weights(), [tp1, ep2], progress=False, hf_reference=False,
        workload=DEFAULT_WORKLOAD,
    )  # fmt: skip
    outcomes = {}
    with GateRun(config) as run:
        for layout in (tp1, ep2):
            for field in fields:
                if (field == "moe_ep_combine") != (layout.ep > 1):
                    continue
                for side in ("rollout", "trainer"):
                    outcome, how = _try_fault(run, Fault(side, "kernel", field), layout)
                    assert outcome != "error", how
                    outcomes[(field, side)] = outcome
            run.release(layout)
    assert len(outcomes) == 2 * len(fields) == 16
    for (field, side), outcome in outcomes.items():
        explained = f"kernel_policy.{field}" in notes
        assert outcome == ("undetected" if explained else "detected"), (field, side, outcome)


def test_gradients_of_a_checkpoint_directory_against_float64(tmp_path):
    """``--grads`` on a Qwen3-MoE checkpoint directory (``save_pretrained``, no experts
    implementation in its config.json): transformers' float64 reference loads it with its eager
    experts loop (its default grouped_mm refuses float64: this exited 1 with a traceback), and
    the trainer's gradients agree with it."""
    import json

    transformers = pytest.importorskip("transformers")
    from contractgen.codegen.vendored import load_target
    from contractgen.parity.reference import reference_config

    profile = load_target("sglang").schema.model_profile_for(MOE_V2)
    torch.manual_seed(0)
    ckpt = tmp_path / "ckpt"
    transformers.Qwen3MoeForCausalLM(reference_config(profile)).save_pretrained(ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.pop("experts_implementation", None)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    code, report, out = run_parity(
        "--contract", MOE_V2, "--checkpoint", str(ckpt), "--layouts", "tp1", "--rollout-tps", "1",
        "--grads", tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 0, out
    (grads,) = report["grads"]["per_layout"]
    assert grads["supported"] and grads["within_tolerance"], grads
