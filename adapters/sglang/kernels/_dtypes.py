"""Dtype-name helpers: the kernel policy names dtypes by their torch attribute name."""

from __future__ import annotations

import torch

# Integer views of the same width, used to move tensors between ranks bit for bit.
_BITS_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def dtype_of(name: str) -> torch.dtype:
    """`"bfloat16"` -> `torch.bfloat16`; a clear error for a name that is not a torch dtype."""
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"kernel policy names dtype {name!r}, which is not a torch dtype name")
    return dt


def bits_view(t: torch.Tensor) -> torch.Tensor:
    """The same bytes viewed as an integer tensor (for exact collectives)."""
    return t.contiguous().view(_BITS_VIEW[t.element_size()])
