"""One fused kernel for the tree all-reduce's sum of gathered partials (CUDA, TP 4 and 8).

``parts_NX`` holds every rank's partial (rank order, one row each) after the all-gather. The
kernel sums them in ``tree_sum``'s order, adjacent pairs level by level, ``((p0 + p1) + (p2 +
p3))`` at 4 and its doubling at 8, with every add done as torch adds two tensors of the dtype
(float32 of the two values, rounded once), so the bits equal the stacked adds' (one launch per
level) in a single read of the gathered buffer. At TP=2 the sum is one add either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .arith import _add

BLOCK = 2048
SIZES = (2, 4, 8)
_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def _tree_sum_kernel(parts_ptr, out_ptr, numel, N: tl.constexpr, DT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    p0 = tl.load(parts_ptr + offs, mask=mask)
    p1 = tl.load(parts_ptr + numel + offs, mask=mask)
    s = _add(p0, p1, DT)
    if N >= 4:
        p2 = tl.load(parts_ptr + 2 * numel + offs, mask=mask)
        p3 = tl.load(parts_ptr + 3 * numel + offs, mask=mask)
        s = _add(s, _add(p2, p3, DT), DT)
    if N == 8:
        p4 = tl.load(parts_ptr + 4 * numel + offs, mask=mask)
        p5 = tl.load(parts_ptr + 5 * numel + offs, mask=mask)
        p6 = tl.load(parts_ptr + 6 * numel + offs, mask=mask)
        p7 = tl.load(parts_ptr + 7 * numel + offs, mask=mask)
        s = _add(s, _add(_add(p4, p5, DT), _add(p6, p7, DT), DT), DT)
    tl.store(out_ptr + offs, s, mask=mask)


def supports(parts_NX: torch.Tensor) -> bool:
    """2, 4 or 8 contiguous rows of a 16- or 32-bit float dtype."""
    return parts_NX.shape[0] in SIZES and parts_NX.dtype in _TL and parts_NX.is_contiguous()


def fused_tree_sum(parts_NX: torch.Tensor) -> torch.Tensor:
    """``tree_sum(list(parts_NX))`` in one launch: ``[N, ...]`` -> ``[...]``."""
    if not supports(parts_NX):
        raise ValueError(
            f"fused_tree_sum takes {SIZES} contiguous rows of {sorted(map(str, _TL))}; got "
            f"{parts_NX.shape[0]} rows of {parts_NX.dtype}"
        )
    out = torch.empty(parts_NX.shape[1:], dtype=parts_NX.dtype, device=parts_NX.device)
    numel = out.numel()
    if numel:
        _tree_sum_kernel[(triton.cdiv(numel, BLOCK),)](
            parts_NX, out, numel, parts_NX.shape[0], _TL[parts_NX.dtype], BLOCK
        )
    return out
