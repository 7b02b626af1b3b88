"""The residual-pair carrier's split (``layers.split_carrier``) joins its two gradients with one
``cat`` (and an ``add_(0.0)``) instead of autograd's two zero-filled slice gradients and their sum
(issue 32: two fills, two copies and an add of ``[T, 2h]`` per layer in the backward). The
gradients must keep their bits, signed zeros included: the old split (plain slicing) is kept
here and both run on planted -0 gradients and over the tiny v1 and v3 trainer. The twin joins
without the ``add_(0.0)`` and must be seen (a -0 stays -0 there).
"""

from __future__ import annotations

import pytest
import torch
from host_sync_probe import same_bits
from megatron_reference import random_sequences, tiny_arch, weights_for
from megatron_testing import single_process_megatron

from contractgen.adapters import kernels
from contractgen.adapters.common.packing import pack_sequences
from contractgen.adapters.megatron import layers as layers_mod
from contractgen.adapters.megatron import transformer_layer as layer_mod
from contractgen.adapters.megatron.checkpoint import load_into
from contractgen.adapters.megatron.model import Layout, build_model, make_config, padded_vocab_size
from contractgen.adapters.megatron.packing import thd_params
from contractgen.adapters.megatron.policy import generated

V1 = "qwen3_dense_true_on_policy_v1"
V3 = "qwen3_dense_true_on_policy_v3"
H = 8


def _legacy_split_carrier(carrier, hidden_size):
    """``layers.split_carrier`` before: two slices, autograd's backward."""
    if carrier.shape[-1] == 2 * hidden_size:
        return carrier[..., :hidden_size], carrier[..., hidden_size:]
    return carrier, None


class _NoCanonicalZero(torch.autograd.Function):
    """The twin: the joined gradient without ``add_(0.0)``."""

    @staticmethod
    def forward(ctx, carrier, h):
        return carrier[..., :h], carrier[..., h:]

    @staticmethod
    def backward(ctx, d_output, d_residual):
        return torch.cat([d_output, d_residual], dim=-1), None


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _carrier_grad(split, use, dtype) -> torch.Tensor:
    """The carrier's gradient when ``use`` ("both", "output", "residual") halves feed a loss
    whose gradient holds +0, -0 and ordinary values."""
    g = torch.Generator().manual_seed(0)
    carrier = torch.randn(5, 2 * H, generator=g).to(dtype).requires_grad_(True)
    w = torch.randn(5, H, generator=g).to(dtype)
    w[0], w[1, ::2], w[2, 1::2] = -0.0, 0.0, -0.0
    out, res = split(carrier, H)
    terms = {"output": (out * w).sum(), "residual": (res * w.flip(0)).sum()}
    loss = sum(v for k, v in terms.items() if use in (k, "both"))
    loss.backward()
    return carrier.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("use", ["both", "output", "residual"])
def test_split_gradient_keeps_its_bits(use, dtype):
    new = _carrier_grad(layers_mod.split_carrier, use, dtype)
    old = _carrier_grad(_legacy_split_carrier, use, dtype)
    assert torch.equal(_bits(new), _bits(old))
    assert (_bits(old) == _bits(torch.tensor(-0.0, dtype=dtype))).any() == (use != "both")


def test_twin_sees_a_kept_negative_zero():
    twin = _carrier_grad(_NoCanonicalZero.apply, "both", torch.float32)
    old = _carrier_grad(_legacy_split_carrier, "both", torch.float32)
    assert not torch.equal(_bits(twin), _bits(old))


@pytest.fixture(scope="module")
def megatron_world():
    with single_process_megatron():
        yield


def _run(contract: str) -> dict:
    arch = tiny_arch(contract, num_layers=2)
    kp = generated().schema.kernel_policy_for(contract)
    padded = padded_vocab_size(arch, 1, kp)
    torch.manual_seed(0)
    model = build_model(make_config(contract, arch, Layout()), arch, pre_process=True,
                        post_process=True, padded_vocab_size=padded)  # fmt: skip
    load_into(model, weights_for(arch, seed=0), arch, tp_rank=0, tp_size=1,
              padded_vocab_size=padded)  # fmt: skip
    model.train()
    pack = pack_sequences(random_sequences((70, 9, 33), 1000, seed=1))
    logits = model(input_ids=pack.token_ids[None], position_ids=pack.positions[None],
                   attention_mask=None, packed_seq_params=thd_params(pack))  # fmt: skip
    lp = kernels.logsoftmax.vocab_parallel_token_logprobs(
        logits[0], torch.roll(pack.token_ids, -1), 0, arch.vocab_size,
        kp,
    )  # fmt: skip
    (-lp.float().sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"logprobs": lp.detach(), "grads": grads}


@pytest.mark.parametrize("contract", [V1, V3])
def test_split_keeps_the_trainer_bits(contract, monkeypatch, megatron_world):
    calls = []
    monkeypatch.setattr(layers_mod._SplitCarrier, "backward",
                        staticmethod(_counting(layers_mod._SplitCarrier.backward, calls)))  # fmt: skip
    new = _run(contract)
    assert len(calls) == 2  # layer 2's add-norm and the final norm (layer 1 reads the embedding)
    with monkeypatch.context() as m:
        m.setattr(layers_mod, "split_carrier", _legacy_split_carrier)
        m.setattr(layer_mod, "split_carrier", _legacy_split_carrier)
        old = _run(contract)
    assert len(calls) == 2 and same_bits(new, old)


def _counting(fn, calls):
    def backward(ctx, *grads):
        calls.append(1)
        return fn(ctx, *grads)

    return backward
