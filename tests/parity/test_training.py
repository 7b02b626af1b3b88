"""``parity --train-steps``: bitwise rollout/trainer agreement at every step of an RL run.

The run (slow) proves the loop with what is deterministic in it: every step's pairs exact, the
importance ratio exactly 1, the loss bit for bit its value at ratio 1 (minus the token mean of
the advantages), the advantages those of the rewards, the weights the rollout loaded equal to the
trainer's gathered shards, and each layout's step-0 gradient within tolerance of float64
autograd (the reward's trend is a fixed-seed coin flip, so nothing asserts it). The fault runs
prove the gate sees what it claims: a trainer-only log-softmax dtype moves the ratio (and the
loss off its ratio-1 value) at step 0, one stale rollout shard breaks step 1 (and only step 1
onwards), and the attention backward without the softmax scale in dK, invisible to every pair,
fails the step-0 gradient check (``test_training_grads.py``).
"""

from __future__ import annotations

import struct

import pytest
import torch
from conftest import V1, run_parity

from contractgen.parity.training import (
    STALE_SHARD,
    TrainingConfig,
    grpo_advantages,
    reward,
    stale_tensor,
    step_workload,
)


def test_grpo_advantages_are_normalised_within_each_group():
    adv = grpo_advantages([0.0, 1.0, 0.5, 0.5, 0.2, 0.2, 0.2, 0.2], group_size=4)
    first, second = adv[:4], adv[4:]
    assert abs(sum(first)) < 1e-9 and first[1] > first[2] == first[3] > first[0]
    assert second == [0.0] * 4  # equal rewards: no signal, not a division by zero


def test_reward_counts_low_ids_in_the_response():
    assert reward([0, 124, 125, 999], vocab_size=1000) == 0.5
    assert reward([], vocab_size=1000) == 0.0


def test_step_workload_groups_share_a_prompt_and_differ_by_seed():
    cfg = TrainingConfig(steps=2, prompts=2, group_size=4, prompt_tokens=70, new_tokens=6)
    step0, again, step1 = (step_workload(s, cfg, 1000) for s in (0, 0, 1))
    assert step0 == again, "a step's workload is a pure function of the step"
    assert len(step0) == 8 and {w.temperature for w in step0} == {1.0}
    groups = [step0[:4], step0[4:]]
    assert all(len({w.prompt_ids for w in g}) == 1 for g in groups)
    assert groups[0][0].prompt_ids != groups[1][0].prompt_ids
    assert max(w.prompt_len for w in step0) == 70  # spans two 64-position KV chunks
    assert len({w.seed for w in step0}) == 8
    assert step1[0].prompt_ids != step0[0].prompt_ids, "every step gets fresh prompts"


def _bf16(weights):
    return {k: v.to(torch.bfloat16) for k, v in weights.items()}


def test_rollout_gathers_back_what_it_loaded(reference_weights):
    """The inverse of the rollout's sharding at TP=1, and a pushed tensor that was not loaded
    is reported by name."""
    from contractgen.adapters.common.rollout import sync_report, weights_digest
    from contractgen.adapters.sglang.model import ReferenceModel
    from contractgen.adapters.sglang.session import policies

    arch, weights = reference_weights
    pushed = _bf16(weights)
    _, kp, rp = policies(V1, 1, None, {}, {})
    model = ReferenceModel(arch, pushed, kp, rp)
    gathered, problems = model.gathered_weights()
    assert problems == [] and set(gathered) == set(pushed)
    assert all(torch.equal(gathered[k].double(), pushed[k].double()) for k in pushed)
    report = sync_report(model, pushed)  # the digest of what it holds: the pushed weights'
    assert report == {"synced": True, "mismatched": [], "problems": [],
                      "digest": weights_digest(pushed), "adapter_digest": None}  # fmt: skip
    name = stale_tensor(arch)
    newer = dict(pushed, **{name: pushed[name] + 1})
    report = sync_report(model, newer)  # it still holds (and digests) the older tensor
    assert report == {"synced": False, "mismatched": [name], "problems": [],
                      "digest": weights_digest(pushed), "adapter_digest": None}  # fmt: skip


def test_rollout_gathers_back_every_expert_of_an_moe_model():
    from contractgen.adapters.common.rollout import sync_report, weights_digest
    from contractgen.adapters.sglang.model import ModelArch, ReferenceModel, random_weights
    from contractgen.adapters.sglang.session import policies
    from contractgen.codegen.vendored import load_target

    moe = "qwen3_moe_true_on_policy_v1"
    arch = ModelArch.from_profile(load_target("sglang").schema.model_profile_for(moe))
    pushed = _bf16(random_weights(arch, seed=0))
    assert any(".mlp.experts.7." in name for name in pushed)
    _, kp, rp = policies(moe, 1, None, {}, {})
    report = sync_report(ReferenceModel(arch, pushed, kp, rp), pushed)
    assert report == {"synced": True, "mismatched": [], "problems": [],
                      "digest": weights_digest(pushed), "adapter_digest": None}  # fmt: skip


def test_the_advantage_weighted_logprob_is_recomputed_from_what_the_step_sent():
    """The parent's value of the trainer's ``advantage_logprob`` and its float32 bound; the gate
    fails a layout whose value is outside it (advantages on the wrong sequences)."""
    from contractgen.parity.training import advantage_logprob, failures

    old = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5, -0.5])]
    want, bound = advantage_logprob(old, [1.0, -1.0])
    assert want == (-3.0 + 1.0) / 4 and bound == (4 + 4) * 2.0**-24 * 4.0 / 4
    swapped, _ = advantage_logprob(old, [-1.0, 1.0])  # each sequence the other's advantage
    assert abs(swapped - want) == 1.0

    def report(got: float) -> dict:
        entry = {"name": "tp1", "loss": 0.0, "loss_if_ratio_one": 0.0, "weights_synced": True,
                 "advantage_logprob": got, "advantage_logprob_want": want,
                 "advantage_logprob_bound": bound}  # fmt: skip
        return {"steps": [{"step": 0, "pairs": [], "ratio_max_abs_dev": 0.0, "grads": None,
                           "per_layout": [entry]}]}  # fmt: skip

    assert failures(report(want + bound / 2)) == []
    (message,) = failures(report(swapped))
    assert message.startswith("step 0: tp1: the trainer's advantage-weighted logprob 0.5 is not")
    assert failures(report(float("nan"))), "a NaN is never within the bound"


def test_stale_shard_keeps_only_the_last_ranks_old_copy(reference_weights):
    """The fault skips one tensor of the update on the last rank only; the engine a rank keeps
    across pushes then still holds that tensor's old value (loaded in place, never rebuilt),
    and the sync check names it. A first push (``reset``) loads everything."""
    from contractgen.adapters.common.rollout import RolloutJob, WeightSync, sync_report, update_for
    from contractgen.adapters.common.shared_tensors import SharedTensors
    from contractgen.adapters.sglang import session as rollout
    from contractgen.adapters.sglang.session import policies

    arch, weights = reference_weights
    name = stale_tensor(arch)
    old, new = _bf16(weights), {k: v.to(torch.bfloat16) + 1 for k, v in weights.items()}
    stale_job = RolloutJob(V1, new, 2, arch=arch, weight_sync=WeightSync(stale=name))
    assert name not in update_for(stale_job, 1, 2) and len(update_for(stale_job, 0, 2)) == len(new)  # fmt: skip
    first = RolloutJob(V1, old, 2, arch=arch, weight_sync=WeightSync(reset=True, stale=name))
    assert len(update_for(first, 1, 2)) == len(old)
    assert name.startswith("model.layers.0.") and name.endswith("down_proj.weight")

    _, kp, rp = policies(V1, 1, None, {}, {})
    try:
        for job in (
            RolloutJob(V1, SharedTensors.pack(old), 1, arch=arch, weight_sync=WeightSync(reset=True)),
            RolloutJob(V1, SharedTensors.pack(new), 1, arch=arch, weight_sync=WeightSync(stale=name)),
        ):  # fmt: skip
            engine = rollout._held_engine(job, kp, rp, arch, None, None, update_for(job, 0, 1))
        assert len(rollout._ENGINE) == 1, "one engine kept across the pushes"
        held, _ = engine.model.gathered_weights()
        assert torch.equal(held[name], old[name])
        assert all(torch.equal(held[k].to(torch.bfloat16), new[k]) for k in new if k != name)
        report = sync_report(engine.model, new, digest="sent")
        assert report["mismatched"] == [name] and report["digest"] != "sent"
        assert sync_report(engine.model, held, digest="sent")["digest"] == "sent"
    finally:
        rollout._ENGINE.clear()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--train-fault", STALE_SHARD], "need --train-steps"),
        (["--train-steps", "1", "--inject-faults"], "--inject-faults cannot be combined"),
        (["--train-steps", "1", "--grads"], "--grads cannot be combined"),
        (["--train-steps", "1", "--train-fault", "nope"], "--train-fault 'nope': unknown"),
        (["--no-grad-check"], "need --train-steps"),
        (["--train-microbatches", "2"], "need --train-steps"),
        (["--train-distributed-optimizer"], "need --train-steps"),
        (
            ["--train-steps", "1", "--layouts", "tp1", "--train-fault", "dp.desync_rank"],
            "dp.desync_rank needs a data-parallel layout",
        ),
        (
            ["--train-steps", "1", "--layouts", "dp2", "--train-microbatches", "5"],
            "layout dp2 gives each of its 2 data-parallel ranks 4 of the step's 8 sequences",
        ),
        (["--plant-bug", "attention_dk_scale_dropped"], "a gradient-only bug"),
        (
            ["--train-steps", "1", "--no-grad-check", "--plant-bug", "attention_dk_scale_dropped"],
            "drop --no-grad-check",
        ),
    ],
)
def test_training_options_are_checked_before_anything_runs(tmp_path, args, message):
    from click.testing import CliRunner

    from contractgen.cli import main

    report = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["parity", "--json", str(report), *args])
    out = result.output
    assert result.exit_code == 2 and not report.exists(), out
    assert message in out and isinstance(result.exception, SystemExit | None)
    if "unknown" in message:
        assert STALE_SHARD in out and "kernel.logsoftmax_dtype@trainer" in out


def _bits(x: float) -> bytes:
    """A float's bit pattern (``-0.0 == 0.0`` in Python; their bits differ)."""
    return struct.pack("<d", x)


def _grpo(rewards: list[float], group: int) -> list[float]:
    """GRPO advantages written out again: (r - group mean) / (population std + 1e-6)."""
    out = []
    for lo in range(0, len(rewards), group):
        g = rewards[lo : lo + group]
        mean = sum(g) / len(g)
        std = (sum((r - mean) ** 2 for r in g) / len(g)) ** 0.5
        out += [(r - mean) / (std + 1e-6) for r in g]
    return out


RL_RUN = ("--layouts", "tp1,tp2,pp2,cp2", "--rollout-tps", "1,2", "--new-tokens", "6")
"""The suite's RL workload: every layout kind, rollout TP 1 and 2, 2 prompts x 4 samples x 6
tokens (48 scored per pair)."""


@pytest.mark.slow
def test_three_rl_steps_stay_bit_identical_at_every_layout(tmp_path):
    code, report, out = run_parity("--train-steps", "3", *RL_RUN, tmp_path=tmp_path)
    assert code == 0, out
    steps = report["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2]
    for s in steps:
        assert len(s["pairs"]) == 8 and all(p["exact"] for p in s["pairs"]), s["pairs"]
        assert all(p["tokens_compared"] == 48 for p in s["pairs"])
        assert s["ratio_max_abs_dev"] == 0.0 and s["kl"] == 0.0
        assert s["weights_synced"] and s["rollout_tokens_identical"]
        assert {e["name"] for e in s["per_layout"]} == {"tp1", "tp2", "pp2", "cp2"}
        for e in s["per_layout"]:
            # the loss/ratio identity: at a ratio of exactly 1, min(r A, clip(r) A) is A bit for
            # bit, so the PPO loss is minus the token mean of the advantages, to the bit
            assert _bits(e["loss"]) == _bits(e["loss_if_ratio_one"]), e
            # and the advantages are the rewards' (each response has 6 tokens of 48)
            assert all(abs(6 * r - round(6 * r)) < 1e-9 for r in e["rewards"]), e["rewards"]
            assert e["advantages"] == pytest.approx(_grpo(e["rewards"], 4), abs=1e-12)
            want = -sum(6 * a for a in e["advantages"]) / 48
            assert abs(e["loss_if_ratio_one"] - want) <= 1e-6, (e["loss_if_ratio_one"], want)
            # the advantages the trainer applied, per sequence: its sum(A * logp) / tokens is the
            # one the parent recomputes from what it sent, within float32 rounding; a sign flip
            # or another sequence's advantage would be far outside (sum over the step: nonzero)
            got, want, bound = (e[f"advantage_logprob{k}"] for k in ("", "_want", "_bound"))
            assert abs(got - want) <= bound < 1e-4, (got, want, bound)
            assert any(e["advantages"]) <= (abs(2 * want) > bound), (want, bound)
    # step 0: every layout starts from the same weights, so samples the same (one rollout,
    # reused by the later layouts) and gets the same rewards
    first = steps[0]["per_layout"]
    assert all(e["rewards"] == first[0]["rewards"] for e in first)
    assert [e["rollouts_reused"] for e in first] == [[], [1, 2], [1, 2], [1, 2]]
    # each layout's step-0 gradient vs float64 autograd (the check --grads makes); later steps
    # carry none
    grads = steps[0]["grads"]
    assert grads["note"] is None and [g["name"] for g in grads["per_layout"]] == [
        "tp1", "tp2", "pp2", "cp2",
    ]  # fmt: skip
    for g in grads["per_layout"]:
        assert g["within_tolerance"] and 0 < g["max_rel_diff"] <= grads["tolerance"], g
        assert g["parameters_compared"] == grads["per_layout"][0]["parameters_compared"] > 0
    assert all(s["grads"] is None for s in steps[1:])
    # where the time went, per layout and summed over layouts
    phases = {"rollout", "score", "trainer_step", "forward_backward", "optimizer", "sync"}
    for s in steps:
        assert phases <= set(s["time_s"]) and all(t >= 0 for t in s["time_s"].values())
        assert s["time_s"]["rollout"] == pytest.approx(
            sum(e["time_s"]["rollout"] for e in s["per_layout"]), abs=1e-3
        )
    assert "grad_check" in steps[0]["time_s"] and "grad_check" not in steps[1]["time_s"]
    assert out.count("8/8") == 3  # the table: one line per step, every pair exact


@pytest.mark.slow
def test_a_trainer_only_logsoftmax_dtype_moves_the_ratio_at_step_zero(tmp_path):
    code, report, out = run_parity(
        "--train-steps", "1", "--layouts", "tp1", "--rollout-tps", "1", "--new-tokens", "4",
        "--train-fault", "kernel.logsoftmax_dtype@trainer", "--no-grad-check", tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 1, out
    (step,) = report["steps"]
    assert not step["exact"] and step["ratio_max_abs_dev"] > 0.0
    assert step["weights_synced"], "the fault is in the scoring, not in the weights"
    assert "importance ratio off 1" in out
    (entry,) = step["per_layout"]  # the ratio off 1: the loss leaves its ratio-1 value
    assert _bits(entry["loss"]) != _bits(entry["loss_if_ratio_one"])
    assert "is not its value at ratio 1" in out
    assert step["grads"] is None and report["training"]["grad_check"] is False


@pytest.mark.slow
def test_one_stale_rollout_shard_breaks_step_one(tmp_path):
    code, report, out = run_parity(
        "--train-steps", "2", "--layouts", "tp1", "--rollout-tps", "1,2", "--new-tokens", "4",
        "--train-fault", STALE_SHARD, "--no-grad-check", tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 1, out
    first, second = report["steps"]
    assert first["exact"] and first["weights_synced"], "step 0 loads every tensor afresh"
    assert not second["weights_synced"] and not second["exact"]
    stale = report["training"]["stale_tensor"]
    (entry,) = second["per_layout"]
    assert entry["stale"] == {"tp1": [stale], "tp2": [stale]}
    assert "rollout weights differ from the trainer's" in out


def test_a_broken_session_reports_what_its_ranks_sent():
    """When a rank exits, the session's error carries the tracebacks ranks sent first (received
    or still queued), not only "rank(s) [0] exited"."""
    import queue

    from contractgen.adapters.common.workers import errors_before_exit

    results = queue.Queue()
    results.put((0, "err", "Traceback: rank 0 ran out of memory", None, None))
    text = errors_before_exit({1: ("err", "Traceback: connection reset"), 2: ("ok", None)}, results)
    assert "rank 0:\nTraceback: rank 0 ran out of memory" in text
    assert "rank 1:\nTraceback: connection reset" in text and "rank 2" not in text
    assert errors_before_exit({}, queue.Queue()) == ""
