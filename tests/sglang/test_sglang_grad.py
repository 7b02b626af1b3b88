"""The kernels stay differentiable (the trainer side calls them): gradcheck in float64."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.autograd import gradcheck

from contractgen.adapters.kernels import (
    apply_rope,
    chunked_attention,
    invariant_matmul,
    rms_norm,
    rope_cos_sin,
    silu_glu,
    token_logprobs,
    vocab_parallel_token_logprobs,
)


@pytest.fixture(scope="module")
def kp64(kp):
    return dataclasses.replace(
        kp, **{f.name: "float64" for f in dataclasses.fields(kp) if f.name.endswith("_dtype")}
    )


def _r(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()


def test_matmul_grad(kp64):
    x, w = _r(2, 260), _r(3, 260, seed=1)  # 3 K tiles, the last one zero padded
    assert gradcheck(lambda a, b: invariant_matmul(a, b, kp64), (x, w))


def test_norm_rope_silu_grad(kp64):
    x, w = _r(4, 2, 16), _r(16, seed=1)
    cos, sin = rope_cos_sin(torch.arange(4), 16, 1e4, None, kp64)
    assert gradcheck(lambda a, b: apply_rope(rms_norm(a, b, 1e-6, kp64), cos, sin, kp64), (x, w))
    assert gradcheck(lambda g, u: silu_glu(g, u, kp64), (_r(7), _r(7, seed=2)))


def test_attention_grad(kp64):
    q, k, v = _r(5, 2, 8), _r(5, 1, 8, seed=1), _r(5, 1, 8, seed=2)
    kp = dataclasses.replace(kp64, attention_kv_chunk=2)
    assert gradcheck(lambda a, b, c: chunked_attention(a, b, c, torch.arange(5), kp), (q, k, v))


def test_logprob_grads(kp64):
    kp = dataclasses.replace(kp64, logsoftmax_vocab_block=4)
    logits, ids = _r(3, 10), torch.tensor([0, 4, 8])
    assert gradcheck(lambda x: token_logprobs(x, ids, kp, 9), (logits,))
    assert gradcheck(lambda x: vocab_parallel_token_logprobs(x, ids, 0, 9, kp), (logits,))
