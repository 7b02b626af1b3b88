"""The trainer's gradients keep their bits with the norm backward that multiplies ``x`` and the
rounded ``x̂`` in their own dtype (no float32 copies; ``tests/kernels/test_backward_widening.py``
checks the function alone, with RoPE's and SiLU-GLU's). The old function is kept here verbatim
and both run the tiny model (v1 and v3, two layers: four norms a layer and the final one): the
logprobs and every gradient must have the same bit patterns. The twin flips whether the old
function rounds ``x̂`` before the weight gradient, a change the comparison must see.
"""

from __future__ import annotations

import pytest
import torch
from host_sync_probe import same_bits
from megatron_reference import random_sequences, tiny_arch, weights_for
from megatron_testing import single_process_megatron

from contractgen.adapters import kernels
from contractgen.adapters.common.packing import pack_sequences
from contractgen.adapters.kernels import norm as norm_mod
from contractgen.adapters.megatron.checkpoint import load_into
from contractgen.adapters.megatron.model import Layout, build_model, make_config, padded_vocab_size
from contractgen.adapters.megatron.packing import thd_params
from contractgen.adapters.megatron.policy import generated

V1 = "qwen3_dense_true_on_policy_v1"
V3 = "qwen3_dense_true_on_policy_v3"


def _legacy_rms_norm_backward(x, weight, r, dy, cast_before_weight: bool):
    """``kernels.norm.rms_norm_backward`` before (float32 copies of ``x`` and ``x̂``)."""
    md = torch.promote_types(x.dtype, torch.float32)
    x_hat = x.to(md) * r.to(md)[..., None]
    factor = x_hat.to(x.dtype).to(md) if cast_before_weight else x_hat
    dy = dy.to(md)
    g = dy * weight.to(md)
    dx = r.to(md)[..., None] * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    dw = (dy * factor).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


def _twin_rms_norm_backward(x, weight, r, dy, cast_before_weight: bool):
    return _legacy_rms_norm_backward(x, weight, r, dy, not cast_before_weight)


@pytest.fixture(scope="module", autouse=True)
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
def test_norm_backward_keeps_the_trainer_bits(contract, monkeypatch):
    new = _run(contract)
    with monkeypatch.context() as m:
        m.setattr(norm_mod, "rms_norm_backward", _legacy_rms_norm_backward)
        old = _run(contract)
    assert any("layernorm" in n for n in new["grads"]) and same_bits(new, old)


def test_twin_sees_the_weight_gradient_rounding(monkeypatch):
    new = _run(V3)
    with monkeypatch.context() as m:
        m.setattr(norm_mod, "rms_norm_backward", _twin_rms_norm_backward)
        twin = _run(V3)
    assert not same_bits(new, twin)
