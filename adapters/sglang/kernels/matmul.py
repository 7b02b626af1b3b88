"""Batch-, N- and TP-invariant matmul: ``y_MN = x_MK @ w_NK.T`` with a declared K-tile order.

How the invariances are obtained (CPU and CUDA alike, pure PyTorch):

* K is cut into tiles of ``kp.matmul_k_block``. Each tile partial is one float32 dot product
  (operands upcast to float32, so bf16 products are exact; float64 stays float64 for gradient
  checks) rounded once to ``kp.matmul_accumulation_dtype``; tiles are combined in
  ``kp.matmul_tile_order``.
* Batch invariance: the underlying GEMM is always called on fixed ``M_TILE x k_block x N_TILE``
  blocks (rows and columns zero-padded), so a row's bits never depend on how many rows, or which
  other rows, are in the call (plain ``torch.matmul`` changes kernels with M: M=1 is a GEMV).
* N invariance: columns are cut into fixed ``N_TILE`` blocks the same way, so a column-parallel
  shard whose boundary is a multiple of ``N_TILE`` (64) reproduces the full result's columns.
* TP invariance: a row-parallel rank holding a whole subtree of tiles computes that subtree; the
  fixed-tree all-reduce (``all_reduce.py``) finishes the tree.

K not a multiple of the block: the last tile is zero-padded to the block width (the documented
fallback). That is still batch invariant, but TP invariance then needs each rank's K to be whole
tiles, which the contract's layout validation guarantees for the shapes it admits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ._dtypes import dtype_of
from .all_reduce import pairwise_sum

M_TILE = 64  # rows per GEMM call
N_TILE = 64  # columns per GEMM call


def first_level_block(num_tiles: int) -> int:
    """SGLang's first-level run length: start at T, halve while even and greater than 2.

    Kept identical to the generated ``schema.first_level_block`` (a test pins the two together).
    """
    block = num_tiles
    while block % 2 == 0 and block > 2:
        block //= 2
    return block


def sequential_sum(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Left fold ``((p0 + p1) + p2) + ...`` in the parts' dtype."""
    acc = parts[0]
    for part in parts[1:]:
        acc = acc + part
    return acc


def _sglang_first_level(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    block = first_level_block(len(parts))
    runs = [sequential_sum(parts[i : i + block]) for i in range(0, len(parts), block)]
    return pairwise_sum(runs)


def _binary(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    return pairwise_sum(list(parts))


TILE_ORDERS: dict[str, Callable[[Sequence[torch.Tensor]], torch.Tensor]] = {
    "sglang_first_level": _sglang_first_level,
    "binary": _binary,
}


def combine_tiles(parts: Sequence[torch.Tensor], order: str) -> torch.Tensor:
    """Sum tile partials (each ``[M, N]`` in the accumulation dtype) in the named order."""
    try:
        combine = TILE_ORDERS[order]
    except KeyError:
        raise ValueError(
            f"unknown matmul_tile_order {order!r}; known: {sorted(TILE_ORDERS)}"
        ) from None
    return combine(parts)


def _gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for 16-bit and float32 operands; float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


def _weight_tiles(w_NK: torch.Tensor, k_block: int, T: int) -> torch.Tensor:
    """``w`` as GEMM operands (float32, or float64) ``[T, nN, k_block, N_TILE]`` (zero padded).

    Cached per weight tensor (and its version) when no gradient flows into it: decode steps call
    the same weights over and over."""
    cacheable = not (torch.is_grad_enabled() and w_NK.requires_grad)
    key = (w_NK._version, tuple(w_NK.shape), k_block, M_TILE, N_TILE)
    if cacheable:
        hit = getattr(w_NK, "_contractgen_tiles", None)
        if hit is not None and hit[0] == key:
            return hit[1]
    N, K = w_NK.shape
    Np = math.ceil(N / N_TILE) * N_TILE
    w32 = F.pad(w_NK.to(_gemm_dtype(w_NK.dtype)), (0, T * k_block - K, 0, Np - N))
    tiles = w32.view(Np // N_TILE, N_TILE, T, k_block).permute(2, 0, 3, 1).contiguous()
    if cacheable:
        w_NK._contractgen_tiles = (key, tiles)
    return tiles


def tile_partials(
    x_MK: torch.Tensor, w_NK: torch.Tensor, k_block: int, acc_dtype: torch.dtype
) -> torch.Tensor:
    """Per-K-tile partial products ``P_TMN[t] = x[:, tile t] @ w[:, tile t].T``.

    Each partial is a float32 dot over exactly ``k_block`` values (zero padded), computed on fixed
    ``M_TILE x k_block x N_TILE`` GEMMs and rounded once to ``acc_dtype``.
    """
    M, K = x_MK.shape
    N = w_NK.shape[0]
    T = max(1, math.ceil(K / k_block))
    Mp = math.ceil(M / M_TILE) * M_TILE
    w_T_n_kb_Nt = _weight_tiles(w_NK, k_block, T)
    x32 = F.pad(x_MK.to(w_T_n_kb_Nt.dtype), (0, T * k_block - K, 0, Mp - M))
    nM, nN = Mp // M_TILE, w_T_n_kb_Nt.shape[1]
    x_T_m_Mt_kb = x32.view(nM, M_TILE, T, k_block).permute(2, 0, 1, 3)
    # bmm over every (tile, row block, column block): each GEMM is M_TILE x k_block x N_TILE
    a = x_T_m_Mt_kb.unsqueeze(2).expand(T, nM, nN, M_TILE, k_block).reshape(-1, M_TILE, k_block)
    b = w_T_n_kb_Nt.unsqueeze(1).expand(T, nM, nN, k_block, N_TILE).reshape(-1, k_block, N_TILE)
    p = torch.bmm(a, b).view(T, nM, nN, M_TILE, N_TILE)
    p_TMN = p.permute(0, 1, 3, 2, 4).reshape(T, Mp, nN * N_TILE)[:, :M, :N]
    return p_TMN.to(acc_dtype)


def invariant_matmul(
    x_MK: torch.Tensor,
    w_NK: torch.Tensor,
    kp,
    *,
    out_dtype: torch.dtype | None = None,
    tile_order: str | None = None,
) -> torch.Tensor:
    """``x @ w.T`` with batch/N/TP invariance; leading dims of ``x`` are kept.

    ``out_dtype`` defaults to ``x``'s dtype; row-parallel callers ask for the accumulation dtype so
    the all-reduce continues the tree before the single final cast. ``tile_order`` overrides
    ``kp.matmul_tile_order`` (the plain-binary variant passes ``"binary"``).
    """
    lead = x_MK.shape[:-1]
    x2 = x_MK.reshape(-1, x_MK.shape[-1])
    acc = dtype_of(kp.matmul_accumulation_dtype)
    p_TMN = tile_partials(x2, w_NK, kp.matmul_k_block, acc)
    y_MN = combine_tiles(list(p_TMN.unbind(0)), tile_order or kp.matmul_tile_order)
    y_MN = y_MN.to(out_dtype or x_MK.dtype)
    return y_MN.reshape(*lead, w_NK.shape[0])


def binary_matmul(x_MK: torch.Tensor, w_NK: torch.Tensor, kp, **kw) -> torch.Tensor:
    """The same tiles combined by a plain binary tree over all tiles (Megatron's public order)."""
    return invariant_matmul(x_MK, w_NK, kp, tile_order="binary", **kw)
