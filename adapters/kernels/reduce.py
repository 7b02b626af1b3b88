"""Fixed-order sums: the one reduction every contract kernel uses.

``torch.sum`` picks its association from the tensor's shape and the device (CPU vector width, the
CUDA reduce kernel's threads per output grow when there are few outputs), so a row summed alone
(decode) and inside a batch (prefill) can differ in the last bit. ``fixed_sum`` is a halving tree
of elementwise adds, ``x[:h] + x[h:]`` after zero-padding to a power of two: each output's order
depends only on the reduced length, on any device and any batch shape.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fixed_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum over ``dim`` (removed) in the fixed halving-tree order."""
    if dim not in (-1, x.dim() - 1):
        x = x.movedim(dim, -1)
    n = x.shape[-1]
    width = 1 << max(0, (n - 1).bit_length())
    if width != n:
        x = F.pad(x, (0, width - n))
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def fixed_mean(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """``fixed_sum / n``."""
    n = x.shape[dim]
    out = fixed_sum(x, dim) / n
    return out.unsqueeze(dim if dim >= 0 else out.dim() + 1 + dim) if keepdim else out
