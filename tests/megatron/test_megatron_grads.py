"""Ulysses CP backward and ``defer_ulysses_cp_loss_scaling_to_grad_sum``: the gradient scale."""

from __future__ import annotations

import pytest
import torch

from contractgen.adapters.megatron.trainer import TrainerFault, TrainerRun, trainer_logprobs_runs

V1 = "qwen3_dense_true_on_policy_v1"

pytestmark = pytest.mark.slow


def test_ulysses_cp_gradient_scale(arch, weights, sequences):
    """CP=2 ranks each own half the tokens; their gradients summed with the contract's scale
    (cp / dp_cp) equal the CP=1 gradient of the whole loss; megatron's default (1 / dp_cp,
    the field flipped) gives exactly half of it."""
    run = TrainerRun(dtype_override="float32", grads=True)
    flipped = TrainerRun(
        dtype_override="float32",
        grads=True,
        fault=TrainerFault(runtime_policy={"defer_ulysses_cp_loss_scaling_to_grad_sum": False}),
    )
    (cp1,) = trainer_logprobs_runs(V1, weights, sequences, (1, 1, 1), [run], arch=arch)
    cp2, cp2_flipped = trainer_logprobs_runs(
        V1, weights, sequences, (1, 1, 2), [run, flipped], arch=arch
    )
    names = [n for n in cp1.grads if "layers.0." in n or "embedding" in n]
    assert len(names) >= 5
    for name in names:
        full, deferred, default = cp1.grads[name], cp2.grads[name], cp2_flipped.grads[name]
        assert full.abs().max() > 0, name
        torch.testing.assert_close(deferred, full, rtol=1e-4, atol=1e-6)
        assert torch.equal(default * 2, deferred), name
