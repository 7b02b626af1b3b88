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
