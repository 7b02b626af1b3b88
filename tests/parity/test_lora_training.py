"""LoRA RL steps (issue 34): the trainer trains A and B alone and pushes them alone; the rollout
reports the digest of the adapter it serves, and a stale or missing adapter fails the step.

Fast: the handshake's verdicts, the rollout's adapter digest and the adapter faults' effect on
what a rank loads, one trainer session (init + one step at tp1), the CLI's refusals. Slow: one
``--lora 8 --train-steps 2`` run at tp1, exact, and both sync faults failing it."""

from __future__ import annotations

import pytest
import torch
from conftest import run_parity

from contractgen.adapters.common.lora import LORA_ALPHA_KEY, is_adapter_name, random_adapter
from contractgen.adapters.common.rollout import weights_digest
from contractgen.adapters.sglang.model import ReferenceModel, random_weights
from contractgen.adapters.sglang.session import model_arch, policies
from contractgen.parity.training import NO_ADAPTER, STALE_ADAPTER, adapter_check

QWEN = "qwen3_dense_lora_true_on_policy_v1"
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def lora_weights():
    arch, _ = model_arch(QWEN, {})
    return arch, random_weights(arch, 0), random_adapter(arch, MODULES, 8, 12.0)


def _served(adapter: dict) -> dict:
    """The adapter as the trainer pushes it (A and B in bf16, alpha float64)."""
    return {k: v if k == LORA_ALPHA_KEY else v.to(torch.bfloat16) for k, v in adapter.items()}


def test_adapter_check_names_stale_and_missing_adapters() -> None:
    assert adapter_check(None, {"tp1": None}, []) is None, "no adapter pushed: nothing to check"
    ok = adapter_check("b", {"tp1": "b", "tp2": "b"}, ["a"])
    assert ok["synced"] and ok["mismatch"] == {}
    bad = adapter_check("c", {"tp1": "b", "tp2": None, "tp4": "z"}, ["a", "b"])
    assert not bad["synced"]
    assert bad["mismatch"] == {
        "tp1": "step 1's adapter: stale",
        "tp2": "the rollout ran on the base weights alone",
        "tp4": "an adapter the trainer never pushed",
    }


def test_rollout_digests_the_adapter_it_serves_and_the_faults_skip_it(lora_weights) -> None:
    """The rollout hashes the adapter it holds (not the push); ``skip_adapter`` keeps the held
    one (stale) or, on a first push, leaves the engine without one (no adapter)."""
    from contractgen.adapters.common.rollout import RolloutJob, WeightSync, sync_report, update_for
    from contractgen.adapters.sglang import session as rollout

    arch, base, adapter = lora_weights
    first = {**{k: v.to(torch.bfloat16) for k, v in base.items()}, **_served(adapter)}
    newer = _served({k: v if k == LORA_ALPHA_KEY else v * 2 for k, v in adapter.items()})
    _, kp, rp = policies(QWEN, 1, None, {}, {})
    try:
        job = RolloutJob(QWEN, first, 1, arch=arch, weight_sync=WeightSync(reset=True))
        engine = rollout._held_engine(job, kp, rp, arch, None, None, update_for(job, 0, 1))
        report = sync_report(engine.model, first)
        assert report["synced"] and report["adapter_digest"] == weights_digest(_served(adapter))
        stale = RolloutJob(QWEN, newer, 1, arch=arch, weight_sync=WeightSync(skip_adapter=True))
        assert update_for(stale, 0, 1) == {}, "an adapter-only push, all skipped"
        engine = rollout._held_engine(stale, kp, rp, arch, None, None, {})
        report = sync_report(engine.model, newer)
        assert report["adapter_digest"] == weights_digest(_served(adapter)), "still step 0's"
        assert not report["synced"] and all(is_adapter_name(n) for n in report["mismatched"])
        taken = RolloutJob(QWEN, newer, 1, arch=arch, weight_sync=WeightSync())
        engine = rollout._held_engine(taken, kp, rp, arch, None, None, update_for(taken, 0, 1))
        assert sync_report(engine.model, newer)["adapter_digest"] == weights_digest(newer)
        rollout._ENGINE.clear()
        none = RolloutJob(QWEN, first, 1, arch=arch,
                          weight_sync=WeightSync(reset=True, skip_adapter=True))  # fmt: skip
        update = update_for(none, 0, 1)
        assert update and not any(is_adapter_name(n) for n in update)
        engine = rollout._held_engine(none, kp, rp, arch, None, None, update)
        assert sync_report(engine.model, first)["adapter_digest"] is None
    finally:
        rollout._ENGINE.clear()
    plain = ReferenceModel(arch, base, kp, rp)
    assert sync_report(plain, base)["adapter_digest"] is None


def test_trainer_trains_only_the_adapter_and_pushes_it_alone(lora_weights) -> None:
    """TrainInit: base + adapter pushed (A, B rounded to bf16 as served), the optimizer holds
    the adapter's elements alone; a step: the push is the adapter alone, A and B moved."""
    from contractgen.adapters.common.run_types import OptimizerSettings, TrainBatch, TrainInit
    from contractgen.adapters.megatron.trainer import TrainerSession
    from contractgen.parity.layouts import parse_layouts

    arch, base, adapter = lora_weights
    layout = parse_layouts("tp1")[0]
    seqs = (tuple(range(3, 15)), tuple(range(40, 49)))
    prompt_lens = (8, 5)
    with TrainerSession(QWEN, {**base, **adapter}, layout) as trainer:
        init = trainer.train(TrainInit(OptimizerSettings(lr=1e-2)))
        pushed = init.weights.tensors()
        assert set(pushed) == set(base) | set(adapter)
        assert weights_digest({k: v for k, v in pushed.items() if is_adapter_name(k)}) == (
            weights_digest(_served(adapter))
        )
        adapter_elems = sum(v.numel() for k, v in adapter.items() if k != LORA_ALPHA_KEY)
        assert init.trained["trainable"] == adapter_elems
        # every base weight frozen (megatron's stage pads the vocabulary rows: at least as many)
        assert init.trained["frozen"] >= sum(v.numel() for v in base.values())
        old = tuple(torch.zeros(len(s) - p) for s, p in zip(seqs, prompt_lens, strict=True))
        step = trainer.train(TrainBatch(seqs, prompt_lens, old, (1.0, -1.0)))
        after = step.weights.tensors()
    assert set(after) == set(adapter), "a LoRA step pushes the adapter alone"
    assert torch.equal(after[LORA_ALPHA_KEY], adapter[LORA_ALPHA_KEY])
    moved = [k for k in after if k != LORA_ALPHA_KEY and not torch.equal(after[k], pushed[k])]
    assert moved, "the step trained A and B"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--train-steps", "1", "--train-fault", NO_ADAPTER],
         f"error: --train-fault {NO_ADAPTER} needs a LoRA adapter to push: add --lora RANK"),
        (["--contract", QWEN, "--lora", "8", "--train-fault", STALE_ADAPTER], "need --train-steps"),
    ],
)  # fmt: skip
def test_adapter_faults_are_checked_before_anything_runs(tmp_path, args, message) -> None:
    from click.testing import CliRunner

    from contractgen.cli import main

    report = tmp_path / "report.json"
    result = CliRunner().invoke(
        main, ["parity", "--quiet", "--json", str(report), "--layouts", "tp1", *args]
    )
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and not report.exists(), result.output
    assert len(lines) == 1 and message in lines[0], result.output


@pytest.mark.slow
def test_lora_rl_steps_are_exact_and_the_adapter_faults_fail(tmp_path) -> None:
    """``--lora 8 --train-steps 2`` at tp1: every step exact, ratio 1, the adapter alone pushed
    after step 0 and served; each sync fault fails on the adapter digest."""
    run = ("--contract", QWEN, "--lora", "8", "--train-steps", "2", "--layouts", "tp1",
           "--rollout-tps", "1", "--new-tokens", "6", "--no-grad-check")  # fmt: skip
    code, data, out = run_parity(*run, tmp_path=tmp_path)
    assert code == 0, out
    steps = data["steps"]
    assert all(s["exact"] and s["ratio_max_abs_dev"] == 0.0 for s in steps)
    assert [s["push"]["adapter_only"] for s in steps] == [False, True]
    assert steps[1]["push"]["bytes"] < steps[1]["push"]["full_bytes"] == steps[0]["push"]["bytes"]
    assert all(s["adapter_synced"] for s in steps)
    first, second = (s["per_layout"][0]["adapter"]["pushed"] for s in steps)
    assert first != second, "step 0 trained the adapter"
    for fault, step, why in (
        (STALE_ADAPTER, 1, "step 0's adapter: stale"),
        (NO_ADAPTER, 0, "the rollout ran on the base weights alone"),
    ):
        code, data, out = run_parity(*run, "--train-fault", fault, tmp_path=tmp_path)
        assert code == 1, out
        line = f"step {step}: tp1: adapter digest mismatch: rollout tp1 serves "
        assert line in out and why in out, out
        assert not data["steps"][step]["adapter_synced"]
