"""Dtype-name helpers: the kernel policy names dtypes by their torch attribute name."""

from __future__ import annotations

import torch


def dtype_of(name: str) -> torch.dtype:
    """`"bfloat16"` -> `torch.bfloat16`; a clear error for a name that is not a torch dtype."""
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"kernel policy names dtype {name!r}, which is not a torch dtype name")
    return dt


def bits_view(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t`` as a flat uint8 tensor (for exact collectives; gloo moves bytes of
    any dtype, including bfloat16, which its reductions do not support)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def from_bits(b: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Inverse of ``bits_view``: bytes back to ``like``'s dtype and shape."""
    return b.view(like.dtype).view(like.shape)
