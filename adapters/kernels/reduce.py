"""Fixed-order sums: the one reduction every contract kernel uses.

``torch.sum`` picks its association from the tensor's shape and the device (CPU vector width, the
CUDA reduce kernel's threads per output grow when there are few outputs), so a row summed alone
(decode) and inside a batch (prefill) can differ in the last bit. ``fixed_sum`` is a halving tree
of elementwise adds, ``x[:h] + x[h:]`` after zero-padding to a power of two: each output's order
depends only on the reduced length, on any device and any batch shape. ``sequential_sum`` and
``pairwise_sum`` are the two list orders the matmul's tile combination and the tree all-reduce
are built from (a leaf module: ``matmul.py`` and ``all_reduce.py`` both import it).
"""

from __future__ import annotations

from collections.abc import Sequence

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


def sequential_sum(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Left fold ``((p0 + p1) + p2) + ...`` in the parts' dtype."""
    acc = parts[0]
    for part in parts[1:]:
        acc = acc + part
    return acc


def pairwise_sum(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Adjacent pairwise sums ``((p0+p1),(p2+p3)),...`` level by level; an odd last one is carried."""
    level = list(parts)
    while len(level) > 1:
        nxt = [level[i] + level[i + 1] for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]
