"""Batch-, N- and TP-invariant matmul: ``y_MN = x_MK @ w_NK.T`` with a declared K-tile order.

How the PyTorch backend (the reference; ``triton/matmul.py`` is the CUDA backend, same tile order,
bf16 tensor-core tile dots) obtains the invariances:

* K is cut into tiles of ``kp.matmul_k_block``. Each tile partial is one float32 dot product
  (operands upcast to float32, so bf16 products are exact; float64 stays float64 for gradient
  checks) rounded once to ``kp.matmul_accumulation_dtype``; tiles are combined in
  ``kp.matmul_tile_order``.
* Batch invariance: every GEMM is a fixed ``M_TILE x k_block x N_TILE`` block (rows and columns
  zero padded), batched ``BLOCKS_PER_CALL`` at a time, so a row's bits never depend on how many rows, or
  which other rows, are in the call (plain ``torch.matmul`` changes kernels with M: M=1 is a GEMV;
  on CUDA, cuBLAS picks kernels by N too).
* N invariance: columns are cut into fixed ``N_TILE`` blocks the same way, so a column-parallel
  shard whose boundary is a multiple of ``N_TILE`` (64) reproduces the full result's columns.
* Memory: K tiles are upcast one at a time, the blocks of one batched call gathered at a time, and
  tiles combined as they are produced (``streamed_matmul``): no permanent float32 weight copy, no
  ``[T, M, N]`` stack of partials, no ``M*N*K``-sized operands (the form used until 2026-11-30;
  ``tests/kernels`` pins the bits to it). Large outputs are computed in output panels of at most
  ``PANEL_ELEMENTS`` (whole ``M_TILE`` x ``N_TILE`` blocks, the full K loop per panel), so the
  float32 working set of an LM head ``[tokens, vocab]`` is one panel's, not the whole output's:
  each output element has the same blocks, K tiles and combine order whatever the panel.
* TP invariance: a row-parallel rank holding a whole subtree of tiles computes that subtree; the
  fixed-tree all-reduce (``all_reduce.py``) finishes the tree.
* ``fixed_runs`` (v3): K is ``kp.matmul_k_runs`` equal runs whatever K is, each run its tiles'
  float32 partials added in order (no rounding inside a run), the runs a binary tree in float32.
  A rank's K under TP is ``matmul_k_runs / TP`` of the full K's runs, so a row-parallel call
  passes ``shard_policy(kp, tp)``; the other orders derive their runs from the K they are given.
  A call not made through ``shard_policy`` is a matmul whose K no layout splits (column-parallel,
  LM head): it runs ``kp.matmul_column_k_runs`` runs where the contract sets that (v4: 1, one
  float32 dot over all of K), else ``matmul_k_runs`` (``k_runs``).

K not a multiple of the block: the last tile is zero-padded to the block width (the documented
fallback). That is still batch invariant, but TP invariance then needs each rank's K to be whole
tiles, which the contract's layout validation guarantees for the shapes it admits.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._dtypes import dtype_of
from .policy import KernelPolicy
from .reduce import pairwise_sum, sequential_sum
from .registry import kernel
from .tile_runs import (
    TILE_ORDERS,
    _run_length,
    combine_tiles,
    fixed_run_width,
    k_runs,
    shard_policy,
)

# Re-exported: callers import the tile orders and sums from here.
__all__ = [
    "TILE_ORDERS",
    "binary_matmul",
    "combine_tiles",
    "fixed_run_width",
    "invariant_matmul",
    "k_runs",
    "pairwise_sum",
    "reference_matmul",
    "sequential_sum",
    "shard_policy",
    "streamed_matmul",
    "tile_partials",
]

M_TILE = 64  # rows per GEMM call
N_TILE = 64  # columns per GEMM call


def _gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for 16-bit and float32 operands; float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


def _k_tile(t_MK: torch.Tensor, t: int, k_block: int, rows: int, gd: torch.dtype) -> torch.Tensor:
    """K tile ``t`` of ``t_MK`` as a ``[rows, k_block]`` GEMM operand in ``gd`` (zero padded)."""
    lo = t * k_block
    tile = t_MK[:, lo : lo + k_block].to(gd)
    if tile.shape == (rows, k_block):
        return tile
    return F.pad(tile, (0, k_block - tile.shape[1], 0, rows - tile.shape[0]))


# GEMM blocks per batched call: always exactly this many (the last call zero padded), so the
# BLAS never sees another batch shape either (cuBLAS picks its kernel by the batch count too: a
# batch of one ran another kernel on the H200).
BLOCKS_PER_CALL = 64
# On CPU: at most this many blocks a call, unpadded (bounds the gathered operands to
# 2 x 256 x 64 x k_block float32 values: 16 MiB at k_block 128).
CPU_BLOCKS_PER_CALL = 256


def _tile_product(x_MK: torch.Tensor, w_NK: torch.Tensor, t: int, k_block: int) -> torch.Tensor:
    """``P_MN = x[:, tile t] @ w[:, tile t].T`` in float32 (float64 stays float64), every GEMM a
    fixed ``M_TILE x k_block x N_TILE`` block, batched (``_gathered_calls`` on CUDA,
    ``_broadcast_calls`` elsewhere), so no library ever picks a kernel, or a summation order, by
    M or N. Only this tile is upcast, for this call; the operands of one call are copied out
    (bounded memory)."""
    M, N = x_MK.shape[0], w_NK.shape[0]
    gd = _gemm_dtype(torch.promote_types(x_MK.dtype, w_NK.dtype))
    nM, nN = math.ceil(M / M_TILE), math.ceil(N / N_TILE)
    if nM * nN == 0:  # no rows or no columns: an empty product
        return torch.zeros((M, N), dtype=gd, device=x_MK.device)
    x_m_Mt_kb = _k_tile(x_MK, t, k_block, nM * M_TILE, gd).view(nM, M_TILE, k_block)
    w_n_kb_Nt = _k_tile(w_NK, t, k_block, nN * N_TILE, gd).view(nN, N_TILE, k_block).transpose(1, 2)
    if x_MK.is_cuda:
        p_B_Mt_Nt = _gathered_calls(x_m_Mt_kb, w_n_kb_Nt, BLOCKS_PER_CALL, pad=True)
        p = p_B_Mt_Nt.view(nM, nN, M_TILE, N_TILE).permute(0, 2, 1, 3).reshape(nM * M_TILE, -1)
    else:
        p = _broadcast_calls(x_m_Mt_kb, w_n_kb_Nt).view(nM * M_TILE, nN * N_TILE)
    return p[:M, :N]


def _gathered_calls(
    x_m_Mt_kb: torch.Tensor, w_n_kb_Nt: torch.Tensor, per_call: int, pad: bool
) -> torch.Tensor:
    """Every ``(m, n)`` block pair gathered, ``per_call`` blocks a ``bmm``; ``pad``: the last
    call zero padded to ``per_call`` too (CUDA: cuBLAS picks kernels by batch count).
    ``[nM * nN, Mt, Nt]``."""
    nM, nN = x_m_Mt_kb.shape[0], w_n_kb_Nt.shape[0]
    idx = torch.arange(nM * nN, device=x_m_Mt_kb.device)
    blocks = []
    for lo in range(0, nM * nN, per_call):
        part = idx[lo : lo + per_call]
        short = per_call - part.shape[0] if pad else 0
        a, b = x_m_Mt_kb[part // nN], w_n_kb_Nt[part % nN]
        if short:
            a, b = F.pad(a, (0, 0, 0, 0, 0, short)), F.pad(b, (0, 0, 0, 0, 0, short))
        blocks.append(torch.bmm(a, b)[: part.shape[0]])
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks)


def _broadcast_calls(x_m_Mt_kb: torch.Tensor, w_n_kb_Nt: torch.Tensor) -> torch.Tensor:
    """CPU: the same fixed-shape block GEMMs as ``_gathered_calls``, unpadded (the BLAS runs each
    block of a batch as its own GEMM whatever the count: the bitwise batch-invariance tests show
    it; padding a decode step's few blocks to 64 made small-M linears 3-11x slower), over a grid
    of at most ``CPU_BLOCKS_PER_CALL`` blocks a call. Each operand is expanded over the other's
    blocks (one copy each, not an index gather per pair; never a broadcasting ``matmul``, which
    folds a single row block into another GEMM shape), and each call's blocks are written
    straight into the output's row-major layout. ``[nM, Mt, nN, Nt]``; the same bits as
    ``_gathered_calls`` unpadded (how this path ran before) in every dtype (``tests/kernels/test_matmul_block_calls.py``)."""
    nM, nN = x_m_Mt_kb.shape[0], w_n_kb_Nt.shape[0]
    out = x_m_Mt_kb.new_empty((nM, M_TILE, nN, N_TILE))
    n_step = min(nN, CPU_BLOCKS_PER_CALL)
    m_step = max(1, CPU_BLOCKS_PER_CALL // n_step)
    for m0 in range(0, nM, m_step):
        for n0 in range(0, nN, n_step):
            a = x_m_Mt_kb[m0 : m0 + m_step, None]
            b = w_n_kb_Nt[None, n0 : n0 + n_step]
            grid = (a.shape[0], b.shape[1])
            a = a.expand(*grid, -1, -1).reshape(-1, M_TILE, a.shape[-1])
            # copied as [Nt, kb] blocks, then transposed: the layout a gather gives
            # the BLAS (float64 GEMMs differ in bits between the two layouts)
            b = b.transpose(-1, -2).expand(*grid, -1, -1).reshape(-1, N_TILE, b.shape[-2])
            b = b.transpose(1, 2)
            p = torch.bmm(a, b).view(*grid, M_TILE, N_TILE)
            out[m0 : m0 + m_step, :, n0 : n0 + n_step] = p.transpose(1, 2)
    return out


class _RunStack:
    """Streaming form of ``pairwise_sum``: push parts in order, ``total()`` gives the adjacent
    pairwise sum level by level with an odd last one carried (a binary counter whose leftover
    levels are merged smallest first, which is the same association). Holds at most log2(n)
    partial sums instead of all n parts."""

    def __init__(self) -> None:
        self.levels: list[tuple[int, torch.Tensor]] = []  # (number of parts, their sum)

    def push(self, part: torch.Tensor) -> None:
        size = 1
        while self.levels and self.levels[-1][0] == size:
            left = self.levels.pop()[1]
            part = left + part
            size *= 2
        self.levels.append((size, part))

    def total(self) -> torch.Tensor:
        acc = self.levels[-1][1]
        for _, left in reversed(self.levels[:-1]):
            acc = left + acc
        return acc


# Output elements per panel of ``streamed_matmul`` (4 Mi: 16 MiB per float32 accumulator). An
# output panel is whole GEMM blocks, so its elements' bits are the unpanelled ones.
PANEL_ELEMENTS = 1 << 22


def _panels(M: int, N: int, limit: int) -> list[tuple[int, int, int, int]]:
    """``(m0, m1, n0, n1)`` output panels of at most ``limit`` elements (whole ``M_TILE`` x
    ``N_TILE`` blocks; the last ones end at ``M`` / ``N``), column panels first: a row panel
    re-upcasts every weight tile, a column panel only the small activation tile."""
    if M * N <= limit:
        return [(0, M, 0, N)]
    rows = M if M * N_TILE <= limit else max(M_TILE, limit // N_TILE // M_TILE * M_TILE)
    cols = max(N_TILE, limit // (math.ceil(rows / M_TILE) * M_TILE) // N_TILE * N_TILE)
    return [
        (m0, min(M, m0 + rows), n0, min(N, n0 + cols))
        for m0 in range(0, M, rows)
        for n0 in range(0, N, cols)
    ]


def streamed_matmul(
    x_MK: torch.Tensor,
    w_NK: torch.Tensor,
    k_block: int,
    acc_dtype: torch.dtype,
    order: str,
    *,
    out_dtype: torch.dtype | None = None,
    panel_elements: int = PANEL_ELEMENTS,
    run_tiles: int | None = None,
) -> torch.Tensor:
    """``combine_tiles(tile_partials(x, w, k_block, acc), order)`` (cast to ``out_dtype``,
    default ``acc_dtype``) without holding the ``T`` partials, one output panel at a time
    (``_panels``): per panel, one GEMM per K tile, rounded to ``acc_dtype``, added into its run
    in order, each finished run pushed onto a ``_RunStack``, the panel's total cast into the
    output. Extra memory: O(log T) accumulators of one panel. ``run_tiles``: tiles per run
    (``fixed_runs``, whose runs the policy fixes; else the order's ``_run_length``)."""
    M, N = x_MK.shape[0], w_NK.shape[0]
    panels = _panels(M, N, panel_elements)
    if len(panels) == 1:
        y = _streamed_panel(x_MK, w_NK, k_block, acc_dtype, order, run_tiles)
        return y if out_dtype is None else y.to(out_dtype)
    out = torch.empty((M, N), dtype=out_dtype or acc_dtype, device=x_MK.device)
    for m0, m1, n0, n1 in panels:
        y = _streamed_panel(x_MK[m0:m1], w_NK[n0:n1], k_block, acc_dtype, order, run_tiles)
        out[m0:m1, n0:n1] = y if out_dtype is None else y.to(out_dtype)
    return out


def _streamed_panel(
    x_MK: torch.Tensor,
    w_NK: torch.Tensor,
    k_block: int,
    acc_dtype: torch.dtype,
    order: str,
    run_tiles: int | None = None,
) -> torch.Tensor:
    T = max(1, math.ceil(x_MK.shape[1] / k_block))
    block = run_tiles or _run_length(order, T)
    stack = _RunStack()
    for r in range(0, T, block):
        run_MN = _tile_product(x_MK, w_NK, r, k_block).to(acc_dtype)
        for t in range(r + 1, min(r + block, T)):
            run_MN = run_MN + _tile_product(x_MK, w_NK, t, k_block).to(acc_dtype)
        stack.push(run_MN)
    return stack.total()


def tile_partials(
    x_MK: torch.Tensor, w_NK: torch.Tensor, k_block: int, acc_dtype: torch.dtype
) -> torch.Tensor:
    """All per-K-tile partial products ``P_TMN[t] = x[:, tile t] @ w[:, tile t].T``, each a float32
    dot over exactly ``k_block`` values (zero padded) rounded once to ``acc_dtype``.

    The readable spec (and a test helper): it holds all ``T`` partials, so ``invariant_matmul``
    streams them instead (``streamed_matmul``, same bits)."""
    T = max(1, math.ceil(x_MK.shape[1] / k_block))
    return torch.stack([_tile_product(x_MK, w_NK, t, k_block).to(acc_dtype) for t in range(T)])


def reference_matmul(
    x_MK: torch.Tensor,
    w_NK: torch.Tensor,
    kp: KernelPolicy,
    *,
    out_dtype: torch.dtype | None = None,
    tile_order: str | None = None,
) -> torch.Tensor:
    """The PyTorch backend of ``invariant_matmul`` (CPU reference; any device)."""
    lead = x_MK.shape[:-1]
    x2 = x_MK.reshape(-1, x_MK.shape[-1])
    acc = dtype_of(kp.matmul_accumulation_dtype)
    order = tile_order or kp.matmul_tile_order
    run_tiles = None
    if order == "fixed_runs":  # each run's k_block tiles accumulated in order, runs pairwise
        run_tiles = fixed_run_width(x2.shape[1], kp) // kp.matmul_k_block
    y_MN = streamed_matmul(
        x2, w_NK, kp.matmul_k_block, acc, order, out_dtype=out_dtype or x_MK.dtype,
        run_tiles=run_tiles,
    )  # fmt: skip
    return y_MN.reshape(*lead, w_NK.shape[0])


def invariant_matmul(
    x_MK: torch.Tensor,
    w_NK: torch.Tensor,
    kp: KernelPolicy,
    *,
    out_dtype: torch.dtype | None = None,
    tile_order: str | None = None,
) -> torch.Tensor:
    """``x @ w.T`` with batch/N/TP invariance; leading dims of ``x`` are kept. Runs the backend the
    registry names for ``x``'s device (``registry.kernel``).

    ``out_dtype`` defaults to ``x``'s dtype; row-parallel callers ask for the accumulation dtype so
    the all-reduce continues the tree before the single final cast. ``tile_order`` overrides
    ``kp.matmul_tile_order`` (the plain-binary variant passes ``"binary"``).
    """
    impl = kernel("invariant_matmul", x_MK.device)
    return impl(x_MK, w_NK, kp, out_dtype=out_dtype, tile_order=tile_order)


def binary_matmul(x_MK: torch.Tensor, w_NK: torch.Tensor, kp: KernelPolicy, **kw) -> torch.Tensor:
    """The same tiles combined by a plain binary tree over all tiles (Megatron's public order)."""
    return invariant_matmul(x_MK, w_NK, kp, tile_order="binary", **kw)
