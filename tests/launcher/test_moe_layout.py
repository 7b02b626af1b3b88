"""Issue 13: the launcher's layout rules read the Qwen3-MoE family: experts are sharded over TP
like the dense MLP, so each expert's down_proj K must split into whole tile subtrees."""

from __future__ import annotations

import pytest

from contractgen.adapters.launcher import Layout, build_plan
from contractgen.adapters.launcher.layout import LayoutError

MOE = "qwen3_moe_true_on_policy_v1"


def test_expert_down_proj_k_rules_out_tp4_for_30b_a3b() -> None:
    with pytest.raises(LayoutError) as info:
        build_plan(MOE, Layout(tp=4), "Qwen3-30B-A3B")
    assert "--tp 4: splits expert down_proj K=768 (6 tiles of 128" in str(info.value)
    assert build_plan(MOE, Layout(tp=2), "Qwen3-30B-A3B").contract_id == MOE


def test_235b_a22b_runs_tp4_not_pp4() -> None:
    assert build_plan(MOE, Layout(tp=4, rollout_tp=4), "Qwen3-235B-A22B").contract_id == MOE
    with pytest.raises(LayoutError) as info:
        build_plan(MOE, Layout(pp=4), "Qwen3-235B-A22B")
    assert "--pp 4" in str(info.value)


# --- expert parallelism ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "sizes", "world"),
    [
        ("ep2", {"tp": 1, "ep": 2}, 2),  # two attention-DP ranks carry the two EP ranks
        ("tp2ep2", {"tp": 2, "ep": 2}, 2),  # EP folded over the TP ranks
        ("cp2ep2", {"cp": 2, "ep": 2}, 2),
        ("ep4", {"ep": 4}, 4),
        ("tp2ep4", {"tp": 2, "ep": 4}, 4),
        ("tp4ep2", {"tp": 4, "ep": 2}, 4),
    ],
)
def test_ep_layouts_parse_and_size_their_trainer_session(token, sizes, world) -> None:
    from contractgen.adapters.common.layout import parse_layout

    layout = parse_layout(token)
    assert layout == Layout(**sizes)
    assert layout.world_size == world
    assert layout.name == token
    assert layout.ep_dp * layout.tp * layout.cp % layout.ep == 0


def test_a_dense_contract_refuses_ep_naming_the_contract_field() -> None:
    with pytest.raises(LayoutError) as info:
        build_plan("qwen3_dense_true_on_policy_v1", Layout(tp=2, ep=2), "reference")
    assert "--ep 2: not in the contract's parallel.training.ep [1]" in str(info.value)


def test_ep_must_divide_the_experts_and_the_trainer_ranks() -> None:
    with pytest.raises(LayoutError) as info:
        build_plan(MOE, Layout(tp=2, dp=2, ep=8), "reference")
    assert (
        "--ep 8: does not divide TP 2 x CP 1 x DP 2 = 4 (EP folds over the trainer ranks of one "
        "pipeline stage); valid --ep here: 1, 2, 4 (nearest: --ep 4)"
    ) in str(info.value)
    assert build_plan(MOE, Layout(tp=2, dp=2, ep=4), "reference").layout.ep == 4


def test_whole_experts_under_ep_lift_the_expert_tile_rule_from_the_trainer_tp() -> None:
    """30B-A3B's expert down_proj (K=768, 6 tiles) cannot split over TP 4 at EP 1; under EP 4
    each rank holds whole experts, so that rule no longer binds the trainer's TP (the
    checkpoint's own tp_sizes still does)."""
    with pytest.raises(LayoutError) as ep1:
        build_plan(MOE, Layout(tp=4, rollout_tp=2), "Qwen3-30B-A3B")
    with pytest.raises(LayoutError) as ep4:
        build_plan(MOE, Layout(tp=4, ep=4, rollout_tp=2), "Qwen3-30B-A3B")
    assert "--tp 4: splits expert down_proj K=768" in str(ep1.value)
    assert "splits expert down_proj" not in str(ep4.value)
    assert "--tp 4: not in Qwen3-30B-A3B's tp_sizes [1, 2]" in str(ep4.value)


def test_the_plan_passes_ep_to_megatron_only_under_ep() -> None:
    ep2 = build_plan(MOE, Layout(tp=2, ep=2), "reference").args("megatron")
    assert "--expert-model-parallel-size" in ep2 and "--expert-tensor-parallel-size" in ep2
    i, j = ep2.index("--expert-model-parallel-size"), ep2.index("--expert-tensor-parallel-size")
    assert (ep2[i + 1], ep2[j + 1]) == ("2", "1")
    ep1 = build_plan(MOE, Layout(tp=2), "reference").args("megatron")
    assert not any(a.startswith("--expert-") for a in ep1)


def test_the_gate_suggests_ep_sizes_with_the_dp_each_one_needs() -> None:
    """The gate gives each EP size the attention DP it needs, so ``ep3`` (3 DP ranks) is
    pointed at every EP size the contract and model allow, not only those dividing 3."""
    from contractgen.parity.layouts import layout_problems, parse_layout

    got = layout_problems(MOE, parse_layout("ep3"), "reference")
    assert got and all(p.startswith("ep3: --ep 3: ") for p in got), got
    assert all(p.endswith("valid --ep here: 1, 2, 4, 8 (nearest: --ep 2 or --ep 4)") for p in got)
    assert layout_problems(MOE, parse_layout("ep8"), "reference") == []
