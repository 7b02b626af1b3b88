"""Residual add in the policy's residual dtype."""

from __future__ import annotations

import torch

from ._dtypes import dtype_of
from .policy import KernelPolicy


def residual_add(x: torch.Tensor, residual: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """``x + residual``, both cast to ``kp.residual_dtype`` first; the sum is rounded once to that
    dtype and is what the next norm reads (no wider carried value)."""
    rd = dtype_of(kp.residual_dtype)
    return x.to(rd) + residual.to(rd)
