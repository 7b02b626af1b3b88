"""One conformance suite for every trainer target in the registry.

A target joins this suite by being registered (``codegen/targets.py``): nothing here names one.
Each registered trainer target must, at two layouts of its own axes, (1) score the rollout's
tokens with the rollout's bits for every (rollout TP, layout) pair, within the transformers
tolerance in float32; (2) read the contract's policy (one flipped kernel-policy field moves its
bits); (3) run an RL step at an importance ratio of exactly 1 with the weights it pushed held by
the rollout. Per-target tests of what only one target has stay in that target's folder.
"""

from __future__ import annotations

import pytest
import torch
from conftest import V1, run_parity

from contractgen.codegen.targets import targets_for_role
from contractgen.parity.layouts import parse_layout
from contractgen.parity.targets import adapter, runs_layout

CANDIDATE_LAYOUTS = ("tp1", "tp2", "pp2", "cp2", "fsdp1", "fsdp2")
"""Layouts of at most two ranks; each target runs the first two of its own axes."""

TRAINERS = [t.name for t in targets_for_role("trainer")]


def layouts_of(target: str) -> list[str]:
    mine = [n for n in CANDIDATE_LAYOUTS if runs_layout(target, parse_layout(n))]
    assert len(mine) >= 2, f"{target}: runs fewer than two of {CANDIDATE_LAYOUTS}"
    return mine[:2]


def test_every_registered_trainer_target_is_in_the_suite() -> None:
    assert TRAINERS, "no trainer target registered"
    for name in TRAINERS:
        layouts_of(name)  # each runs two layouts of the candidates


@pytest.mark.slow
@pytest.mark.parametrize("target", TRAINERS)
def test_pairs_are_exact_and_float32_agrees_with_transformers(target: str, tmp_path) -> None:
    layouts = layouts_of(target)
    code, report, out = run_parity(
        "--trainers", target, "--layouts", ",".join(layouts), "--rollout-tps", "1,2",
        "--requests", "3", "--new-tokens", "4", tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 0, out
    assert [e["target"] for e in report["layouts"]] == [target] * len(layouts)
    assert all(e["exact"] and e["tokens_compared"] > 0 for e in report["layouts"]), out
    pairs = [p for p in report["pairs"] if p["target"] == target]
    assert len(pairs) == 2 * len(layouts) and all(p["exact"] for p in pairs), pairs
    trainer_refs = [r for r in report["reference"]["per_layout"] if r["side"] == "trainer"]
    assert len(trainer_refs) == len(layouts)
    assert all(r["within_tolerance"] and r["tokens_compared"] > 0 for r in trainer_refs)


@pytest.mark.slow
@pytest.mark.parametrize("target", TRAINERS)
def test_one_flipped_policy_field_moves_the_bits(target: str, reference_weights) -> None:
    """The target reads the contract's policy: the float32 log-softmax instead of the contract's
    bfloat16 one changes its logprobs (and, run again honestly, it gives the same bits)."""
    api = adapter(target)
    arch, weights = reference_weights
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, arch.vocab_size, (n,), generator=g).tolist() for n in (24, 17)]
    flip = api.TrainerRun(fault=api.TrainerFault(kernel_policy={"logsoftmax_dtype": "float32"}))
    layout = parse_layout(layouts_of(target)[0])
    with api.TrainerSession(V1, weights, layout, arch=arch) as session:
        honest = session.logprobs(seqs).logprobs
        flipped = session.logprobs(seqs, flip).logprobs
        again = session.logprobs(seqs).logprobs
    assert all(torch.equal(a, b) for a, b in zip(honest, again, strict=True))
    assert any(
        not torch.equal(a, b) for a, b in zip(honest, flipped, strict=True)
    ), f"{target}: logsoftmax_dtype flipped, the logprobs kept their bits"


@pytest.mark.slow
@pytest.mark.parametrize("target", TRAINERS)
def test_an_rl_step_keeps_the_ratio_exactly_one(target: str, tmp_path) -> None:
    layout = layouts_of(target)[-1]
    code, report, out = run_parity(
        "--trainers", target, "--layouts", layout, "--train-steps", "2", "--requests", "1",
        "--new-tokens", "4", "--no-grad-check", tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 0, out
    assert [s["step"] for s in report["steps"]] == [0, 1]
    for step in report["steps"]:
        assert step["ratio_max_abs_dev"] == 0.0 and step["kl"] == 0.0, step
        assert step["weights_synced"] and all(p["exact"] for p in step["pairs"]), step["pairs"]
