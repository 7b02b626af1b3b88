"""The step-0 gradient check under LoRA: the trainer's A and B gradients (base frozen) against
peft's float64 autograd over transformers, and a planted LoRA backward bug that parity cannot
see (the forward keeps the kernel's bits) failing it (issue 34)."""

from __future__ import annotations

import pytest
import torch

from contractgen.adapters.megatron.trainer import TrainerRun, trainer_logprobs_runs

QWEN = "qwen3_dense_lora_true_on_policy_v1"
BUG = "lora_grad_scale_twice"


@pytest.fixture(scope="module")
def case():
    """Reference-model weights with an r=8 adapter (alpha 12: scale 1.5, so a doubled scale
    shows), two sequences, and peft's float64 gradients of the gate's loss."""
    from contractgen.adapters.common.lora import random_adapter
    from contractgen.codegen.vendored import load_target
    from contractgen.parity.correctness import GradReference
    from contractgen.parity.reference import hf_grads, hf_model
    from contractgen.parity.targets import rollout_adapter

    schema = load_target("sglang").schema
    profile = schema.model_profile_for(QWEN)
    arch = rollout_adapter().ModelArch.from_profile(profile)
    modules = tuple(schema.CONTRACT_DATA[QWEN]["lora"]["target_modules"])
    weights = rollout_adapter().random_weights(arch, seed=0) | random_adapter(arch, modules, 8, 12)
    seqs = [[(7 * i + 3) % arch.vocab_size for i in range(n)] for n in (21, 13)]
    prompt_lens = [9, 5]
    want = hf_grads(hf_model(weights, profile, torch.float64), seqs, prompt_lens)
    return weights, GradReference(seqs, prompt_lens, want)


@pytest.mark.slow  # spawned trainer (megatron-core) + a float64 peft model: ~25 s
def test_trainer_adapter_grads_match_peft_float64_and_the_planted_bug_fails(case) -> None:
    from contractgen.parity.correctness import GRAD_TOLERANCE, compare_grads
    from contractgen.parity.layouts import Layout

    weights, ref = case
    assert all(".lora_A." in n or ".lora_B." in n for n in ref.grads), "peft trains A and B only"
    assert len(ref.grads) == 4 * 7 * 2 and all(g.abs().max() > 0 for g in ref.grads.values())
    run = TrainerRun(dtype_override="float32", grads=True, prompt_lens=tuple(ref.prompt_lens))
    bugged = TrainerRun(
        dtype_override="float32", grads=True, prompt_lens=tuple(ref.prompt_lens),
        planted_bugs=(BUG,),
    )  # fmt: skip
    honest, planted = trainer_logprobs_runs(QWEN, weights, ref.sequences, (1, 1, 1), [run, bugged])
    ok = compare_grads(ref, Layout(1, 1, 1), honest.hf_grads)
    assert ok["parameters_compared"] == 56 and ok["within_tolerance"], ok
    assert ok["max_rel_diff"] < GRAD_TOLERANCE / 10
    off = compare_grads(ref, Layout(1, 1, 1), planted.hf_grads)
    assert not off["within_tolerance"] and off["max_rel_diff"] > 0.1, off
    # the bug is in the backward alone: the last adapted linear's B (nothing adapted after it
    # feeds its upstream gradient) gets s a second time (s = 1.5)
    name = "model.layers.3.mlp.down_proj.lora_B.weight"
    torch.testing.assert_close(planted.hf_grads[name], honest.hf_grads[name] * 1.5)
