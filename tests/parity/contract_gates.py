"""The gate on a contract's own reference model, as the per-contract numerics tests use it
(``test_v3_fixed_runs``, ``test_v4_column_runs``, ``test_llama3_moe_fixed_runs``): one
``GateRun`` a module, and the check that every trainer layout and the TP=2 rollout give the TP=1
rollout's logprobs bit for bit."""

from __future__ import annotations

from contractgen.parity.harness import GateConfig, GateRun, compare
from contractgen.parity.layouts import Layout


def reference_gate(contract: str, layouts: list[Layout]) -> GateRun:
    """A gate over ``layouts`` on ``contract``'s reference model, seeded random weights."""
    from contractgen.adapters.sglang.model import ModelArch, random_weights
    from contractgen.codegen.vendored import load_target

    arch = ModelArch.from_profile(load_target("sglang").schema.model_profile_for(contract))
    return GateRun(GateConfig(contract, random_weights(arch, seed=0), layouts, progress=False))


def assert_layouts_equal_the_tp1_rollout(gate: GateRun, layouts: list[Layout]) -> None:
    """Each trainer layout scores the TP=1 rollout's 40 tokens with its bits, and the trainer at
    the first layout scores the TP=2 rollout with that rollout's bits."""
    rollout = gate.scored_rollout(gate.rollout(1))
    for layout in layouts:
        cmp = compare(rollout, gate.trainer(layout)[0])
        assert cmp.exact and cmp.tokens_compared == 40, layout
    cmp = compare(gate.scored_rollout(gate.rollout(2)), gate.trainer(layouts[0])[0])
    assert cmp.exact
