"""The FSDP trainer target's session (``adapters/fsdp``, behind the floor's
``common.trainer.TrainerSession``): fsdpN layouts only, its runtime-policy fields load-bearing,
a training step at ratio one, gradients against float64 autograd. The gate's side of the target
(layouts, refusals, the gate run) is ``tests/parity/test_fsdp_target.py``."""

from __future__ import annotations

import dataclasses
import struct
from types import SimpleNamespace

import pytest
import torch

from contractgen.adapters.common.layout import LayoutError, parse_layout
from contractgen.adapters.common.model import ModelArch, random_weights
from contractgen.adapters.common.run_types import OptimizerSettings
from contractgen.adapters.fsdp import (
    TrainBatch,
    TrainerFault,
    TrainerRun,
    TrainerSession,
    TrainInit,
)
from contractgen.adapters.fsdp.trainer import fsdp_ranks
from contractgen.codegen.vendored import load_target
from contractgen.parity.correctness import GRAD_TOLERANCE, compare_grads, grad_reference_of

V1 = "qwen3_dense_true_on_policy_v1"


@pytest.fixture(scope="module")
def reference_weights():
    """The v1 reference model's seeded random weights (what `parity` builds by default). Here,
    not in a conftest: a second conftest module would shadow ``tests/parity/conftest.py`` for
    the parity files' ``from conftest import ...`` when both folders are given to one pytest."""
    arch = ModelArch.from_profile(load_target("fsdp").schema.model_profile_for(V1))
    return arch, random_weights(arch, seed=0)


DK_BUG = "attention_dk_scale_dropped"


def test_fsdp_trainer_refuses_model_parallel_layouts() -> None:
    assert fsdp_ranks(parse_layout("fsdp4")) == 4
    with pytest.raises(LayoutError, match="fsdpN layouts only"):
        fsdp_ranks(parse_layout("tp2"))


@pytest.mark.slow
def test_fsdp_runtime_policy_fields_are_load_bearing() -> None:
    """Each numerics-bearing FSDP runtime field flipped on the trainer alone moves its bits off
    the unfaulted run's (one fsdp1 session, several runs)."""
    arch = ModelArch.from_profile(load_target("fsdp").schema.model_profile_for(V1))
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, arch.vocab_size, (n,), generator=g).tolist() for n in (40, 70)]
    flips = {
        "batch_invariant_mode": False,
        "attn_implementation": "sdpa",
        "param_dtype": "float32",
        "enabled": False,
    }
    with TrainerSession(V1, random_weights(arch, seed=0), parse_layout("fsdp1")) as s:
        base = s.logprobs(seqs, TrainerRun()).logprobs
        again = s.logprobs(seqs, TrainerRun()).logprobs
        faulted = {
            f: s.logprobs(seqs, TrainerRun(fault=TrainerFault(runtime_policy={f: v}))).logprobs
            for f, v in flips.items()
        }
    assert all(torch.equal(a, b) for a, b in zip(base, again, strict=True))  # deterministic
    same = [f for f, lp in faulted.items() if all(map(torch.equal, base, lp))]
    assert not same, f"flipping {same} left the FSDP trainer's logprobs bit-identical"


@pytest.mark.slow
def test_fsdp2_trains_a_step_at_ratio_one_and_pushes_the_updated_weights(reference_weights):
    """``--train-steps``' trainer half at fsdp2: the training forward scores the sequences with
    the bits of the plain forward (ratio exactly 1, loss its value at ratio 1), AdamW moves the
    sharded weights, and the pushed full state dict has every checkpoint name in bfloat16."""
    arch, weights = reference_weights
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, arch.vocab_size, (n,), generator=g).tolist() for n in (40, 31, 25)]
    prompt_lens = (30, 20, 18)
    with TrainerSession(V1, weights, parse_layout("fsdp2"), arch=arch) as s:
        before = s.train(TrainInit(OptimizerSettings(lr=1e-2))).weights.tensors()
        old = [lp[p - 1 :] for lp, p in zip(s.logprobs(seqs).logprobs, prompt_lens, strict=True)]
        batch = TrainBatch(tuple(map(tuple, seqs)), prompt_lens, tuple(old), (1.0, -0.5, 0.25))
        step = s.train(batch)
    after = step.weights.tensors()
    assert step.ratio_max_abs_dev == 0.0 and step.kl == 0.0
    assert struct.pack("<d", step.loss) == struct.pack("<d", step.loss_if_ratio_one)
    assert all(torch.equal(a, b) for a, b in zip(step.logprobs, old, strict=True))
    assert set(after) == set(before) == set(weights)
    assert {t.dtype for t in after.values()} == {torch.bfloat16}
    moved = [k for k in after if not torch.equal(after[k], before[k])]
    assert len(moved) > len(after) // 2, f"AdamW moved only {moved}"


@pytest.mark.slow
def test_fsdp_gradients_match_float64_autograd_and_a_planted_dk_bug_fails_them(reference_weights):
    """The step-0 gradient check on the FSDP trainer (``TrainerRun.grads``: full gradients
    gathered from the fsdp2 shards) is within tolerance of float64 transformers autograd, twice
    with the same bits, and the attention backward without the softmax scale in dK (a bug no
    logprob shows) puts it far outside."""

    arch, weights = reference_weights
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, arch.vocab_size, (n,), generator=g).tolist() for n in (30, 21, 17)]
    prompt_lens = [20, 12, 10]
    ref = grad_reference_of(SimpleNamespace(weights=weights, contract_id=V1), seqs, prompt_lens)
    layout = parse_layout("fsdp2")
    run = TrainerRun(dtype_override="float32", grads=True, prompt_lens=tuple(prompt_lens))
    with TrainerSession(V1, weights, layout, arch=arch) as s:
        honest = s.logprobs(seqs, run).hf_grads
        again = s.logprobs(seqs, run).hf_grads
        planted = s.logprobs(seqs, dataclasses.replace(run, planted_bugs=(DK_BUG,)))
    assert set(honest) == set(ref.grads)
    assert all(torch.equal(honest[k], again[k]) for k in honest)  # deterministic, bitwise
    good = compare_grads(ref, layout, honest)
    assert good["within_tolerance"], good
    assert good["parameters_compared"] == len(ref.grads)
    bad = compare_grads(ref, layout, planted.hf_grads)
    assert not bad["within_tolerance"] and bad["max_rel_diff"] > 100 * GRAD_TOLERANCE, bad
    assert ".self_attn.k_proj." in bad["worst_parameter"] or "k_norm" in bad["worst_parameter"]
