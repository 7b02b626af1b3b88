"""The gate's default layouts follow the contract and the model: each of tp1,tp2,pp2,cp2 (and
the extras) where the launcher's layout rules allow it, tp1 always, and a line for each base
layout left out. Qwen3-Next rules out CP (its linear-attention state runs through every token),
so ``parity --contract qwen3_next_true_on_policy_v1`` with no ``--layouts`` runs without cp2
instead of refusing its own defaults."""

from __future__ import annotations

from contractgen.commands.parity import DEFAULT_LAYOUTS
from contractgen.parity.layouts import default_layouts

NEXT = "qwen3_next_true_on_policy_v1"
V1 = "qwen3_dense_true_on_policy_v1"
MOE = "qwen3_moe_true_on_policy_v1"


def _names(contract, model, **flags):
    flags = {"train_steps": False, "inject_faults": False, **flags}
    chosen, left_out = default_layouts(contract, model, DEFAULT_LAYOUTS, **flags)
    return [lay.name for lay in chosen], left_out


def test_qwen3_next_defaults_leave_cp_out_and_say_why():
    names, left_out = _names(NEXT, "qwen3-next-tiny-random", inject_faults=True)
    assert names == ["tp1", "tp2", "pp2", "tp2pp2"]  # no cp2; no tp4 (2 KV heads)
    assert len(left_out) == 1 and left_out[0].startswith("cp2: --cp 2: ")


def test_dense_defaults_keep_every_base_layout():
    assert _names(V1, "qwen3-tiny-random") == (["tp1", "tp2", "pp2", "cp2", "tp2pp2"], [])
    names, _ = _names(V1, "qwen3-tiny-random", inject_faults=True)
    assert names[-1] == "tp4"


def test_expert_parallel_extras_only_without_training():
    names, _ = _names(MOE, "qwen3-moe-tiny-random")
    assert {"ep2", "tp2ep2"} <= set(names)
    names, _ = _names(MOE, "qwen3-moe-tiny-random", train_steps=True)
    assert not {"ep2", "tp2ep2"} & set(names)
