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

import numpy as np
import torch
import triton
import triton.language as tl

from .._dtypes import dtype_of
from ..norm import RMSNormFunction, reference_rms_norm
from ..policy import KernelPolicy
from .arith import _ieee_add, _ieee_mul, _round
from .rows import rows_AHn

ELEMENTS = 1024  # elements of one program's [BLOCK_R, CH, C] tile: one warp's 32 registers each
CHUNK = 32  # a row is loaded as chunks of this many columns
MAX_N = 16384  # longer rows run the reference
# Calls of more elements run the reference (the same bits: tests/kernels/test_triton_kernels.py).
# An earlier form of this kernel (each tree level a permute and split of a register tile: about
# 5,000 adds a thread) cost 0.9 ms a call at 16k tokens of Qwen3-0.6B on an H200; this one sums
# an axis of two per level (about 70 adds and 40 shuffles a thread, no shared memory, by the
# PTX). None: every size runs here.
FUSED_MAX_ELEMENTS: int | None = None


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _halving_sum(
    x, R: tl.constexpr, CH: tl.constexpr, LOG2CH: tl.constexpr, C: tl.constexpr, LOG2C: tl.constexpr
):
    """Row sums of ``x`` ``[R, CH, C]`` (a row of ``CH * C`` in chunks of ``C``) in
    ``fixed_sum``'s order, ``x[:h] + x[h:]`` until one element is left: first the chunks pair up
    (row halves are whole chunks), then the halves of the one chunk left. Each level sums an axis
    of two, which is one add whatever the compiler does with it (an add commutes exactly)."""
    for i in tl.static_range(LOG2CH):
        x = tl.reduce(tl.reshape(x, (R, 2, CH >> (i + 1), C)), 1, _add)
    x = tl.reshape(x, (R, C))
    for i in tl.static_range(LOG2C):
        x = tl.reduce(tl.reshape(x, (R, 2, C >> (i + 1))), 1, _add)
    return tl.reshape(x, (R,))


@triton.jit
def _rms_norm_fwd(
    x_ptr, w_ptr, y_ptr, r_ptr, rows, n, H, s_a, s_h, inv_n, eps,
    RECIPROCAL: tl.constexpr, CAST_BEFORE_WEIGHT: tl.constexpr, BLOCK_R: tl.constexpr,
    CH: tl.constexpr, LOG2CH: tl.constexpr, C: tl.constexpr, LOG2C: tl.constexpr,
):  # fmt: skip
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_n = tl.arange(0, CH)[:, None] * C + tl.arange(0, C)[None, :]  # [CH, C]: the row's columns
    mask = (offs_r[:, None, None] < rows) & (offs_n[None, :, :] < n)
    r64 = offs_r.to(tl.int64)
    at_x = ((r64 // H) * s_a + (r64 % H) * s_h)[:, None, None] + offs_n[None, :, :]  # x: [A, H, n]
    x = tl.load(x_ptr + at_x, mask=mask, other=0.0).to(tl.float32)
    total = _halving_sum(_ieee_mul(x, x), BLOCK_R, CH, LOG2CH, C, LOG2C)
    if RECIPROCAL:  # torch on CUDA divides by a host scalar as a multiply by its reciprocal
        mean = _ieee_mul(total, inv_n)
    else:
        mean = tl.math.div_rn(total, n.to(tl.float32))
    r = tl.math.rsqrt(_ieee_add(mean, eps))
    x_n = _ieee_mul(x, r[:, None, None])
    w = tl.load(w_ptr + offs_n, mask=offs_n < n, other=0.0)[None, :, :]
    y_ty = y_ptr.dtype.element_ty
    if CAST_BEFORE_WEIGHT:  # both factors in the input dtype, the product rounded once more
        y = _round(_ieee_mul(w.to(y_ty).to(tl.float32), _round(x_n, y_ty).to(tl.float32)), y_ty)
    else:
        y = _round(_ieee_mul(w.to(tl.float32), x_n), y_ty)
    tl.store(y_ptr + r64[:, None, None] * n + offs_n[None, :, :], y, mask=mask)
    tl.store(r_ptr + offs_r, r, mask=offs_r < rows)


def supports(x: torch.Tensor, weight: torch.Tensor, kp: KernelPolicy) -> bool:
    """float32 compute, a bf16/fp16/fp32 input and weight, rows of at most ``MAX_N``."""
    floats = (torch.bfloat16, torch.float16, torch.float32)
    return (
        dtype_of(kp.norm_compute_dtype) == torch.float32
        and x.dtype in floats
        and weight.dtype in floats
        and 0 < x.shape[-1] <= MAX_N
        and x.numel() > 0
    )


# Divide the sum of squares by a multiply with float32(1 / n), as torch's CUDA division by a host
# scalar does (its CPU division divides); None: by the tensor's device.
RECIPROCAL: bool | None = None


def _forward(x3: torch.Tensor, weight: torch.Tensor, eps: float, cast_before_weight: bool):
    """``(y [A * H, n], r [A * H])`` of ``x3`` ``[A, H, n]`` read in place (``rows_AHn``)."""
    a, h, n = x3.shape
    rows = a * h
    recip = x3.is_cuda if RECIPROCAL is None else RECIPROCAL
    inv_n = float(np.float32(1.0) / np.float32(n))
    N = triton.next_power_of_2(n)
    C = min(N, CHUNK)
    block_r = max(1, ELEMENTS // N)
    y = torch.empty((rows, n), dtype=x3.dtype, device=x3.device)
    r = torch.empty(rows, dtype=torch.float32, device=x3.device)
    _rms_norm_fwd[(triton.cdiv(rows, block_r),)](
        x3, weight, y, r, rows, n, h, x3.stride(0), x3.stride(1), inv_n, eps, recip,
        bool(cast_before_weight), block_r, N // C, (N // C).bit_length() - 1, C,
        C.bit_length() - 1, num_warps=max(1, block_r * N // 1024),
    )  # fmt: skip
    return y, r


def triton_rms_norm_r(
    x: torch.Tensor, weight: torch.Tensor, eps: float, kp: KernelPolicy
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference_rms_norm_r`` in one kernel: ``(output, 1 / rms)``. ``x``'s rows are read in
    place (the QK-norm's k heads are a strided slice of the fused QKV output)."""
    y, r = _forward(rows_AHn(x), weight.contiguous(), float(eps), bool(kp.norm_cast_before_weight))
    return y.view(x.shape), r.view(x.shape[:-1])


def triton_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, kp: KernelPolicy
) -> torch.Tensor:
    """The Triton backend of ``rms_norm`` (same signature, cast order and bits); inputs it does
    not take, and those above ``FUSED_MAX_ELEMENTS``, run the reference. Under autograd, the
    analytic backward of ``kernels.norm`` (``RMSNormFunction``)."""
    big = FUSED_MAX_ELEMENTS is not None and x.numel() > FUSED_MAX_ELEMENTS
    if big or not supports(x, weight, kp):
        return reference_rms_norm(x, weight, eps, kp)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return RMSNormFunction.apply(x, weight, eps, kp, triton_rms_norm_r)
    return triton_rms_norm_r(x, weight, eps, kp)[0]
