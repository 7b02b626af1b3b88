"""Triton RMSNorm: the contract's norm in one kernel, with its backward.

The reference (``kernels.norm.rms_norm``) is about twenty PyTorch kernels per call: the cast, the
square, one launch per level of ``fixed_sum``'s halving tree, rsqrt, the multiplies. Under
autograd every tree level's slice adds a zero-filled gradient buffer and a copy. This kernel
computes the same thing with the same operations and the same halving-tree order. Each row of
``BLOCK_R`` rows is loaded once in ``norm_compute_dtype`` (float32), zero-padded to a power of
two ``N``. The sum of squares is added pairwise, ``x[:h] + x[h:]``. Then ``rsqrt(sum / n + eps)``,
the normalised row, and the weight multiply, with the policy's cast order. A row's result depends
only on that row: prefill, decode and any batch give it the same bits. The backward is the
analytic RMSNorm gradient in float32 (PyTorch: a few fused-size elementwise kernels, no tree):
``dx = r * (g - x̂ * mean(g * x̂))`` with ``g = dy * w`` and ``x̂ = x * r``, and ``dw = Σ_rows dy * x̂``.
The gradient is checked against float64 autograd, not bitwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._dtypes import dtype_of
from ..norm import reference_rms_norm
from .matmul import _round

ELEMENTS = 4096  # elements of one program's [BLOCK_R, N] tile
MAX_N = 16384  # longer rows run the reference


@triton.jit
def _halving_sum(x, R: tl.constexpr, N: tl.constexpr, LOG2N: tl.constexpr):
    """Row sums of ``x`` ``[R, N]`` in ``fixed_sum``'s order: ``x[:, :h] + x[:, h:]`` until one
    column is left."""
    for i in tl.static_range(LOG2N):
        a, b = tl.split(tl.permute(tl.reshape(x, (R, 2, N >> (i + 1))), (0, 2, 1)))
        x = a + b
    return tl.reshape(x, (R,))


@triton.jit
def _rms_norm_fwd(
    x_ptr, w_ptr, y_ptr, r_ptr, rows, n, eps,
    CAST_BEFORE_WEIGHT: tl.constexpr, BLOCK_R: tl.constexpr, N: tl.constexpr, LOG2N: tl.constexpr,
):  # fmt: skip
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_n = tl.arange(0, N)
    mask = (offs_r[:, None] < rows) & (offs_n[None, :] < n)
    x = tl.load(x_ptr + offs_r[:, None].to(tl.int64) * n + offs_n[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    mean = tl.math.div_rn(_halving_sum(x * x, BLOCK_R, N, LOG2N), n.to(tl.float32))
    r = tl.math.rsqrt(mean + eps)
    x_n = x * r[:, None]
    w = tl.load(w_ptr + offs_n, mask=offs_n < n, other=0.0)
    y_ty = y_ptr.dtype.element_ty
    if CAST_BEFORE_WEIGHT:  # both factors in the input dtype, the product rounded once more
        y = _round(w.to(y_ty).to(tl.float32) * _round(x_n, y_ty).to(tl.float32), y_ty)
    else:
        y = _round(w.to(tl.float32) * x_n, y_ty)
    tl.store(y_ptr + offs_r[:, None].to(tl.int64) * n + offs_n[None, :], y, mask=mask)
    tl.store(r_ptr + offs_r, r, mask=offs_r < rows)


def supports(x: torch.Tensor, weight: torch.Tensor, kp) -> bool:
    """float32 compute, a bf16/fp16/fp32 input and weight, rows of at most ``MAX_N``."""
    floats = (torch.bfloat16, torch.float16, torch.float32)
    return (
        dtype_of(kp.norm_compute_dtype) == torch.float32
        and x.dtype in floats
        and weight.dtype in floats
        and 0 < x.shape[-1] <= MAX_N
        and x.numel() > 0
    )


def _forward(x2: torch.Tensor, weight: torch.Tensor, eps: float, cast_before_weight: bool):
    rows, n = x2.shape
    N = triton.next_power_of_2(n)
    block_r = max(1, ELEMENTS // N)
    y = torch.empty_like(x2)
    r = torch.empty(rows, dtype=torch.float32, device=x2.device)
    _rms_norm_fwd[(triton.cdiv(rows, block_r),)](
        x2, weight, y, r, rows, n, eps, bool(cast_before_weight), block_r, N, N.bit_length() - 1,
        num_warps=4 if N <= 1024 else 8,
    )  # fmt: skip
    return y, r


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, eps, cast_before_weight):
        y, r = _forward(x2, weight, eps, cast_before_weight)
        ctx.save_for_backward(x2, weight, r)
        ctx.cast_before_weight = cast_before_weight
        return y

    @staticmethod
    def backward(ctx, dy):
        x2, weight, r = ctx.saved_tensors
        x_hat = x2.float() * r[:, None]
        # the factor the weight multiplied: the normalised row, rounded first under the cast order
        factor = x_hat.to(x2.dtype).float() if ctx.cast_before_weight else x_hat
        dy = dy.float()
        g = dy * weight.float()
        dx = r[:, None] * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
        dw = (dy * factor).sum(0)
        return dx.to(x2.dtype), dw.to(weight.dtype), None, None


def triton_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, kp) -> torch.Tensor:
    """The Triton backend of ``rms_norm`` (same signature and cast order); inputs it does not
    take run the reference."""
    if not supports(x, weight, kp):
        return reference_rms_norm(x, weight, eps, kp)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = _RMSNorm.apply(x2, weight.contiguous(), float(eps), bool(kp.norm_cast_before_weight))
    return y.view(x.shape)
