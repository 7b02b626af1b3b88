"""The linear-attention block's pointwise kernels (``kernels/linear_attention.py``: the gates, the
decay, the conv's SiLU) are row invariant, bitwise: a row's output is the same alone, as a
prefix, or anywhere in a packed batch. On CPU ``torch.sigmoid``, ``F.silu`` and ``F.softplus``
are not (their scalar tail rounds differently from their vector body), which split the float32
single-sequence re-score of Qwen3-Next from a packed forward."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from contractgen.adapters.kernels.linear_attention import (
    causal_conv,
    decay_and_beta,
    sigmoid,
    sigmoid_gate,
    silu,
    silu_gate,
    softplus,
)

DTYPES = ["float32", "bfloat16"]


def _kp(dtype: str) -> SimpleNamespace:
    return SimpleNamespace(gate_dtype=dtype, conv_dtype=dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({4: torch.int32, 2: torch.int16, 8: torch.int64}[t.element_size()])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _rows(n: int, *cols: int, scale: float = 4.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *cols, generator=g) * scale


# every window [lo, lo + n) of a 200-row batch whose placement moves the tail of the vector loop
WINDOWS = [(lo, n) for lo in (0, 1, 3, 7, 13) for n in (1, 2, 5, 9, 17, 37, 70, 130)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_gates_are_row_invariant(dtype):
    """``decay_and_beta`` ([T, heads], as few as 4 values a row: the case that split), the output
    gates ``sigmoid_gate`` ([T, 1]: the shared expert's gate) and ``silu_gate``: each window of
    rows computed alone equals the same rows of the whole batch, bit for bit."""
    kp, dt = _kp(dtype), getattr(torch, dtype)
    a, b = _rows(200, 4, seed=1).to(dt), _rows(200, 4, seed=2).to(dt)
    A_log, dt_bias = torch.log(torch.rand(4) * 0.1 + 0.01), torch.randn(4)
    x1, gate1 = _rows(200, 256, seed=3).to(dt), _rows(200, 1, seed=4).to(dt)
    x2, gate2 = _rows(200, 4, 8, seed=5).to(dt), _rows(200, 4, 8, seed=6).to(dt)
    g_all, beta_all = decay_and_beta(a, b, A_log, dt_bias, kp)
    sg_all, zg_all = sigmoid_gate(x1, gate1, kp), silu_gate(x2, gate2, kp)
    for lo, n in WINDOWS:
        w = slice(lo, lo + n)
        g, beta = decay_and_beta(a[w].clone(), b[w].clone(), A_log, dt_bias, kp)
        assert _same_bits(g, g_all[w]), ("decay", lo, n)
        assert _same_bits(beta, beta_all[w]), ("beta", lo, n)
        assert _same_bits(sigmoid_gate(x1[w].clone(), gate1[w].clone(), kp), sg_all[w]), (lo, n)
        assert _same_bits(silu_gate(x2[w].clone(), gate2[w].clone(), kp), zg_all[w]), (lo, n)


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_conv_prefix_is_invariant(dtype):
    """The conv's SiLU runs over one sequence's ``[channels, L]``: a prefix of ``n`` tokens
    (a shorter re-score, a prefill split) gives the whole sequence's first ``n`` rows."""
    kp, dt = _kp(dtype), getattr(torch, dtype)
    x, w = _rows(150, 12, scale=1.0, seed=7).to(dt), _rows(12, 4, scale=0.5, seed=8).to(dt)
    whole, _ = causal_conv(x, w, None, kp)
    for n in (1, 2, 3, 5, 9, 17, 37, 70, 149):
        assert _same_bits(causal_conv(x[:n].clone(), w, None, kp)[0], whole[:n]), n


def test_pointwise_functions_agree_with_torch_and_have_finite_gradients():
    """``sigmoid``/``silu``/``softplus`` are torch's functions to a few float32 ulps (their own
    ``exp`` and rounding), saturate without NaN or inf, and their float64 gradients match
    torch's analytic ones everywhere, 0 and the saturated ends included (float64 differences ~1e-16, from the other formula)."""
    x = torch.cat([torch.linspace(-120.0, 120.0, 4001), torch.tensor([0.0, -0.0, 20.0, 20.5])])
    for ours, ref in ((sigmoid, torch.sigmoid), (silu, F.silu), (softplus, F.softplus)):
        got, want = ours(x), ref(x)
        assert torch.isfinite(got).all(), ours.__name__
        torch.testing.assert_close(got, want, rtol=4 * 2**-23, atol=1e-30)
        x64 = x.double().requires_grad_()
        (grad,) = torch.autograd.grad(ours(x64).sum(), x64)
        x64r = x.double().requires_grad_()
        (grad_ref,) = torch.autograd.grad(ref(x64r).sum(), x64r)
        assert torch.isfinite(grad).all(), ours.__name__
        torch.testing.assert_close(grad, grad_ref, rtol=1e-12, atol=1e-14)
    assert math.isclose(float(sigmoid(torch.tensor(0.0))), 0.5)
