"""RMSNorm (also used per head as QK-norm) with the policy's cast order."""

from __future__ import annotations

import torch

from ._dtypes import dtype_of
from .reduce import fixed_mean
from .registry import kernel


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, kp) -> torch.Tensor:
    """``weight * normalize(x)`` over the last dim, output in ``x``'s dtype, by the backend the
    registry names for ``x``'s device (see ``reference_rms_norm`` for the contract)."""
    return kernel("rms_norm", x.device)(x, weight, eps, kp)


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, kp) -> torch.Tensor:
    """``weight * normalize(x)`` over the last dim; output in ``x``'s dtype (differentiable).

    Cast order: ``x`` -> ``kp.norm_compute_dtype``; mean of squares (``fixed_mean``) and
    ``rsqrt(var + eps)`` there;
    with ``kp.norm_cast_before_weight`` the normalised value is rounded to ``x``'s dtype *before*
    the multiply by ``weight`` (cast to ``x``'s dtype), as HF Qwen3 and SGLang do; otherwise the
    multiply runs in the compute dtype and the product is rounded once.
    """
    cd = dtype_of(kp.norm_compute_dtype)
    x_c = x.to(cd)
    var = fixed_mean(x_c * x_c, -1, keepdim=True)
    x_n = x_c * torch.rsqrt(var + eps)
    if kp.norm_cast_before_weight:
        return weight.to(x.dtype) * x_n.to(x.dtype)
    return (weight.to(cd) * x_n).to(x.dtype)
