"""One conformance suite for every trainer and every rollout target the gate knows.

A target joins this suite by being registered (``codegen/targets.py``; a rollout target: a name
of the gate's ``--rollouts``, ``parity/rollout_targets.py``): nothing here names one.
Each registered trainer target must, at two layouts of its own axes, (1) score the rollout's
tokens with the rollout's bits for every (rollout TP, layout) pair, within the transformers
tolerance in float32; (2) read the contract's policy (one flipped kernel-policy field moves its
bits); (3) run an RL step at an importance ratio of exactly 1 with the weights it pushed held by
the rollout. Each rollout target must (4) pair bitwise with the reference rollout (the gate's
rollout target at TP 1) and with a trainer at two layouts, at every rollout TP it runs (one gate
run holds every rollout target); (5) where its session is the registry's, read the contract's
policy (a flipped field moves its bits, in process). Per-target tests of what only one target has
stay in that target's folder.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import V1, run_parity

from contractgen.adapters.common.rollout import RolloutJob
from contractgen.adapters.common.workload import make_workload
from contractgen.codegen.targets import targets_for_role
from contractgen.parity.layouts import parse_layout
from contractgen.parity.rollout_targets import (
    REFERENCE,
    ROLLOUT_TARGETS,
    RolloutTargetError,
    check_rollouts,
)
from contractgen.parity.targets import adapter, rollout_target, runs_layout

CANDIDATE_LAYOUTS = ("tp1", "tp2", "pp2", "cp2", "fsdp1", "fsdp2")
"""Layouts of at most two ranks; each target runs the first two of its own axes."""

TRAINERS = [t.name for t in targets_for_role("trainer")]
ROLLOUTS = list(ROLLOUT_TARGETS)
ROLLOUT_TPS = (1, 2)
"""The reference's rollout TPs in the rollout pairs (every other rollout target runs TP 1)."""


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


def test_every_registered_rollout_target_is_in_the_suite() -> None:
    assert REFERENCE == rollout_target() and REFERENCE in ROLLOUTS
    assert {t.name for t in targets_for_role("rollout")} <= set(ROLLOUTS)


def _unavailable(target: str) -> str | None:
    """Why the gate refuses ``target`` on this machine for the suite's run (None: it runs)."""
    try:
        check_rollouts([target], "qwen3_dense", lora=False, train_steps=0, inject_faults=False)
    except RolloutTargetError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def rollout_report(tmp_path_factory):
    """One gate run of every rollout target this machine runs (the reference at TP 1 and 2), the
    first trainer at two layouts: (report, output, {target: why it did not run})."""
    missing = {t: why for t in ROLLOUTS if (why := _unavailable(t)) is not None}
    running = [t for t in ROLLOUTS if t not in missing]
    trainer = TRAINERS[0]
    code, report, out = run_parity(
        "--rollouts", ",".join(running), "--trainers", trainer,
        "--layouts", ",".join(layouts_of(trainer)),
        "--rollout-tps", ",".join(map(str, ROLLOUT_TPS)), "--no-reference",
        "--requests", "3", "--prompt-tokens", "96", "--new-tokens", "5",
        tmp_path=tmp_path_factory.mktemp("rollouts"),
    )  # fmt: skip
    assert code == 0, out
    return report, out, missing


@pytest.mark.slow
@pytest.mark.parametrize("target", ROLLOUTS)
def test_a_rollout_target_pairs_bitwise_at_every_tp_it_runs(target: str, rollout_report) -> None:
    report, out, missing = rollout_report
    if target in missing:  # its environment is not here: CI must have it
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"CI must run rollout target {target}: {missing[target]}", pytrace=False)
        pytest.skip(missing[target])
    layouts = layouts_of(TRAINERS[0])
    pairs = [p for p in report["pairs"] if p["rollout_target"] == target]
    tps = ROLLOUT_TPS if target == REFERENCE else (1,)
    assert sorted({p["rollout_tp"] for p in pairs}) == list(tps), pairs
    assert len(pairs) == len(tps) * len(layouts), pairs
    assert all(p["exact"] and p["tokens_compared"] == 15 for p in pairs), pairs
    if target == REFERENCE:  # every rollout TP against its TP 1: same tokens, same bits
        assert [r["tp"] for r in report["rollouts"]] == list(ROLLOUT_TPS)
        assert all(r["tokens_identical"] and r["logprobs_exact"] for r in report["rollouts"])
        return
    (entry,) = [e for e in report["rollout_targets"] if e["target"] == target]
    assert entry["vs"] == f"{REFERENCE} rollout tp1", entry
    assert entry["tokens_identical"] and entry["exact"] and not entry["stock_ops"], entry
    assert entry["contract_op_calls"]["attention"] > 0, entry


@pytest.mark.parametrize("target", [t.name for t in targets_for_role("rollout")])
def test_a_rollout_target_reads_the_contracts_policy(target: str, reference_weights) -> None:
    """A flipped kernel-policy field (the float32 log-softmax) moves the rollout's bits; the
    honest run again gives the same bits (its ``RolloutSession``, TP 1, in this process)."""
    arch, weights = reference_weights
    workload = make_workload(2, 12, 3)
    with adapter(target).RolloutSession(1) as session:
        runs = [
            session.run(RolloutJob(V1, weights, 1, workload, kernel_changes=changes))
            for changes in ({}, {"logsoftmax_dtype": "float32"}, {})
        ]
    honest, flipped, again = ([*r.decode_logprobs, *r.prefill_logprobs] for r in runs)
    assert all(torch.equal(a, b) for a, b in zip(honest, again, strict=True))
    assert any(
        not torch.equal(a.double(), b.double()) for a, b in zip(honest, flipped, strict=True)
    ), f"{target}: logsoftmax_dtype flipped, the rollout's logprobs kept their values"
