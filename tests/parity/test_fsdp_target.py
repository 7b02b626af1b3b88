"""Issue 33, the FSDP trainer target at the gate: bit-identical with the rollout at ``fsdpN``
layouts; layouts go to the trainer whose axes they use; its refusals and left-out faults. The
trainer session itself (its policy fields, a step, gradients) is ``tests/fsdp/test_trainer.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_parity, run_parity_in_process

from contractgen.adapters.common.layout import LayoutError, parse_layout


def test_fsdp_layouts_parse_and_go_to_the_fsdp_trainer_only() -> None:
    from contractgen.parity.targets import runs_layout

    fsdp2 = parse_layout("fsdp2")
    assert (fsdp2.name, fsdp2.world_size, fsdp2.sizes["fsdp"]) == ("fsdp2", 2, 2)
    assert parse_layout("fsdp1").name == "fsdp1" != parse_layout("tp1").name
    assert "fsdp" not in parse_layout("tp2").sizes  # model-parallel reports keep their shape
    for token, megatron, fsdp in (("fsdp1", False, True), ("fsdp4", False, True),
                                  ("tp1", True, False), ("tp2pp2", True, False),
                                  ("dp2", True, False), ("tp2dp2", True, False)):  # fmt: skip
        lay = parse_layout(token)
        assert (runs_layout("megatron", lay), runs_layout("fsdp", lay)) == (megatron, fsdp)
    with pytest.raises(LayoutError):
        parse_layout("fsdp2fsdp2")


def test_a_named_trainer_with_none_of_its_layouts_is_refused(tmp_path: Path) -> None:
    code, report, out = run_parity_in_process(
        "--trainers", "megatron,fsdp", "--layouts", "tp1", tmp_path=tmp_path
    )
    assert code == 2 and report is None
    assert (
        "error: --trainers fsdp: none of the layouts ['tp1'] is one it runs (its axes: fsdp); "
        "add such layouts to --layouts"
    ) in out


def test_lora_on_the_fsdp_trainer_is_refused_in_one_line(tmp_path: Path) -> None:
    """The fsdp trainer runs no LoRA adapters yet: ``--lora`` with it exits 2 before any worker
    starts, naming the trainers that do (it used to start and hang)."""
    code, report, out = run_parity_in_process(
        "--contract", "qwen3_dense_lora_true_on_policy_v1", "--lora", "8", "--trainers", "fsdp",
        "--layouts", "fsdp1", tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 2 and report is None
    assert (
        "error: --lora: the fsdp trainer does not run LoRA adapters yet (trainers that do: "
        "megatron); give --trainers megatron"
    ) in out


def _fault_run(layouts: str, rollout_tps: list[int], trainer: str = "fsdp", hf: bool = True):
    from types import SimpleNamespace

    from contractgen.adapters.common.layout import parse_layouts

    lays = parse_layouts(layouts)
    config = SimpleNamespace(rollout_tps=rollout_tps, hf_reference=hf, layouts=lays)
    return SimpleNamespace(config=config, layouts=lays, trainer_target=trainer)


def test_cross_rank_kernel_faults_are_left_out_only_where_no_rank_could_show_them() -> None:
    """``kernel_policy.all_reduce`` sums TP partials: an fsdpN trainer never has TP, so its
    fault is left out with the reason; the rollout's is tried while some rollout TP is > 1
    (paired with the fsdp layout), and left out when the gate runs rollout TP 1 only. A
    megatron tp2 layout keeps both; EP's field follows EP as before."""
    from contractgen.parity.faults import Fault
    from contractgen.parity.harness import _left_out

    faults = [Fault(side, "kernel", f, "fsdp" if side == "trainer" else "")
              for side in ("rollout", "trainer") for f in ("all_reduce", "moe_ep_combine",
                                                           "matmul_k_block")]  # fmt: skip
    out = _left_out(_fault_run("fsdp2", [1, 2]), _fault_run("fsdp2", [1, 2]).layouts, faults)
    assert set(out) == {"kernel.all_reduce@fsdp", "kernel.moe_ep_combine@fsdp",
                        "kernel.moe_ep_combine@rollout"}  # fmt: skip
    assert out["kernel.all_reduce@fsdp"] == (
        "acts only under tensor parallelism (a sum over TP ranks); the trainer runs no TP > 1 "
        "here (fsdp layouts fsdp2)"
    )
    run = _fault_run("fsdp1,fsdp2", [1])
    assert "kernel.all_reduce@rollout" in _left_out(run, run.layouts, faults)
    run = _fault_run("tp2,ep2", [1], trainer="megatron")
    assert _left_out(run, run.layouts, faults) == {}


def test_a_shared_bug_without_a_reference_is_left_out_with_the_reason() -> None:
    """Planted on both sides, ``silu_glu_sign_flip`` moves no pair's bits and every rollout TP
    alike: with ``--no-reference`` nothing in the run can show it, which the gate says (left
    out) instead of calling it undetected; with a reference it is tried there."""
    from contractgen.parity.faults import SharedBug
    from contractgen.parity.harness import _try_shared

    run = _fault_run("fsdp2", [1], hf=False)
    run.rollout = lambda tp, **kw: None  # TP 1 only: no cross-TP comparison is made
    outcome, how = _try_shared(run, SharedBug("silu_glu_sign_flip"), None, run.layouts[0])
    assert outcome == "left out" and "(--no-reference)" in how and "TPs [1]" in how


@pytest.mark.slow
def test_gate_fsdp_layouts_exact_against_every_rollout_tp(tmp_path: Path) -> None:
    """The gate with both trainer targets: megatron at tp1, FSDP2 at fsdp1 and fsdp2 (two gloo
    ranks, each scoring its share), every pair with rollout TP 1 and 2 bitwise exact."""
    code, report, out = run_parity(
        "--trainers", "megatron,fsdp", "--layouts", "tp1,fsdp1,fsdp2", "--rollout-tps", "1,2",
        "--no-reference", "--requests", "3", "--new-tokens", "4", tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 0, out
    names = [lay["name"] for lay in report["layouts"]]
    assert names == ["tp1", "fsdp/fsdp1", "fsdp/fsdp2"]
    assert all(lay["exact"] and lay["tokens_compared"] > 0 for lay in report["layouts"])
    assert len(report["pairs"]) == 6 and all(p["exact"] for p in report["pairs"])


def test_fsdp_backward_only_fields_are_explained_by_the_target_not_the_contracts() -> None:
    """The fsdp fields no forward can show are the target's notes (every contract), so adding the
    target left the shipped contracts' numerics fingerprints where they were."""
    from types import SimpleNamespace

    import contractgen.adapters.fsdp as fsdp
    from contractgen.codegen.vendored import load_target
    from contractgen.parity.harness import unobservable_notes

    contract = "qwen3_dense_true_on_policy_v1"
    data = load_target("fsdp").schema.CONTRACT_DATA[contract]
    assert not [k for k in data.get("unobservable", {}) if k.startswith("runtime_policy.fsdp.")]
    run = SimpleNamespace(trainer_adapter=fsdp, trainer_target="fsdp")
    notes = unobservable_notes(contract, run)
    assert set(fsdp.UNOBSERVABLE) == {"reduce_dtype", "keep_fp32_master"}
    for field in fsdp.UNOBSERVABLE:
        assert notes[f"runtime_policy.fsdp.{field}"] == fsdp.UNOBSERVABLE[field]
    assert "runtime_policy.fsdp.reduce_dtype" not in unobservable_notes(contract)
