"""RMSNorm (also used per head as QK-norm) with the policy's cast order.

Forward: the backend the registry names (the PyTorch reference below; one Triton kernel on CUDA).
Backward, for both: the analytic RMSNorm gradient from the saved ``1 / rms`` (``rms_norm_backward``),
a handful of full-size elementwise kernels, instead of autograd through every level of
``fixed_sum``'s tree (each level's slice adds a zero-filled gradient buffer and a copy). The
gradient is checked against float64 autograd, not bitwise (only forward bits are the contract).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._dtypes import dtype_of
from .policy import KernelPolicy
from .reduce import fixed_mean
from .registry import kernel

NormForward = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, kp: KernelPolicy) -> torch.Tensor:
    """``weight * normalize(x)`` over the last dim, output in ``x``'s dtype, by the backend the
    registry names for ``x``'s device (see ``reference_rms_norm_r`` for the contract)."""
    return kernel("rms_norm", x.device)(x, weight, eps, kp)


def reference_rms_norm_r(
    x: torch.Tensor, weight: torch.Tensor, eps: float, kp: KernelPolicy
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight * normalize(x), 1 / rms)`` over the last dim; the output in ``x``'s dtype, the
    reciprocal RMS per row (``x.shape[:-1]``) in ``kp.norm_compute_dtype``.

    Cast order: ``x`` -> ``kp.norm_compute_dtype``; mean of squares (``fixed_mean``) and
    ``rsqrt(var + eps)`` there;
    with ``kp.norm_cast_before_weight`` the normalised value is rounded to ``x``'s dtype *before*
    the multiply by ``weight`` (cast to ``x``'s dtype), as HF Qwen3 and SGLang do; otherwise the
    multiply runs in the compute dtype and the product is rounded once.
    """
    cd = dtype_of(kp.norm_compute_dtype)
    x_c = x.to(cd)
    r = torch.rsqrt(fixed_mean(x_c * x_c, -1, keepdim=True) + eps)
    x_n = x_c * r
    if kp.norm_cast_before_weight:
        return weight.to(x.dtype) * x_n.to(x.dtype), r[..., 0]
    return (weight.to(cd) * x_n).to(x.dtype), r[..., 0]


def rms_norm_backward(x, weight, r, dy, cast_before_weight: bool):
    """``(dx, dw)`` of ``y = w ⊙ x̂``, ``x̂ = x · r`` with ``r = 1/rms(x)`` saved by the forward:
    ``dx = r (g - x̂ · mean(g ⊙ x̂))`` with ``g = dy ⊙ w``, ``dw = Σ_rows dy ⊙ x̂`` (``x̂`` rounded to
    ``x``'s dtype first when the forward rounded it before the multiply). Math in ``x``'s dtype
    promoted to at least float32; results in the input dtypes.

    ``x`` and the rounded ``x̂`` enter their products in their own dtype: a product with an ``md``
    operand is computed in ``md``, and widening to ``md`` is exact, so this is the product of the
    widened copies, bit for bit, without writing them (two full-size casts fewer)."""
    md = torch.promote_types(x.dtype, torch.float32)
    x_hat = x * r.to(md)[..., None]
    factor = x_hat.to(x.dtype) if cast_before_weight else x_hat
    dy = dy.to(md)
    g = dy * weight.to(md)
    dx = r.to(md)[..., None] * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    dw = (dy * factor).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


class RMSNormFunction(torch.autograd.Function):
    """A backend's forward (``forward_r``: output and ``1/rms``), ``rms_norm_backward``'s gradient."""

    @staticmethod
    def forward(ctx, x, weight, eps, kp: KernelPolicy, forward_r: NormForward):
        y, r = forward_r(x, weight, eps, kp)
        ctx.save_for_backward(x, weight, r)
        ctx.cast_before_weight = bool(kp.norm_cast_before_weight)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, r = ctx.saved_tensors
        dx, dw = rms_norm_backward(x, weight, r, dy, ctx.cast_before_weight)
        return dx, dw, None, None, None


def reference_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, kp: KernelPolicy
) -> torch.Tensor:
    """The PyTorch backend of ``rms_norm``: ``reference_rms_norm_r``'s output, with the analytic
    backward under autograd."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return RMSNormFunction.apply(x, weight, eps, kp, reference_rms_norm_r)
    return reference_rms_norm_r(x, weight, eps, kp)[0]
