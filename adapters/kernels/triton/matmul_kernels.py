"""The two Triton matmul launches, same arithmetic per output element: ``_mm_persistent``
(large M: programs loop over output tiles) and ``_mm_runs`` (small M: one program per output
tile and run, the last to finish combining the partials in the fixed order). ``matmul.py``
launches them.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .arith import _to_out
from .matmul_tiles import (
    _push,
    _run,
    _runs_tree,
    _total,
)


@triton.jit
def _mm_persistent(
    x_ptr, w_ptr, x_desc, w_desc, y_ptr, M, N, K, sxm, swn, sym,
    RUN: tl.constexpr, NUM_RUNS: tl.constexpr, ACC: tl.constexpr, NUM_PROGS: tl.constexpr,
    ITERS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, TMA: tl.constexpr, FUSED: tl.constexpr, OUT: tl.constexpr,
):  # fmt: skip
    """Operands by pointer (``x_ptr``, ``w_ptr``) or, with ``TMA``, through the descriptors
    (``x_desc``, ``w_desc``); the other pair is None. ``y`` is stored in ``OUT``: ``ACC``, or
    under ``fixed_runs`` the caller's dtype (the float32 sum rounded once, in the epilogue)."""
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    # ITERS (>= tiles / programs, rounded up to a power of two so few M values compile apart)
    # is a compile-time bound: Triton's interpreter cannot loop to a runtime scalar.
    for i in range(ITERS):
        tile = pid + i * NUM_PROGS
        if tile < grid_m * grid_n:
            _mm_tile(
                x_ptr, w_ptr, x_desc, w_desc, y_ptr, tile, grid_m, grid_n, M, N, K, sxm, swn, sym,
                RUN, NUM_RUNS, ACC, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K, TMA, FUSED, OUT,
            )  # fmt: skip


@triton.jit
def _tile_coords(tile, grid_m, grid_n, GROUP_M: tl.constexpr):
    """Output tile ``tile`` in grouped order: GROUP_M row blocks share each weight column block
    while it is in L2."""
    group = tile // (GROUP_M * grid_n)
    first_m = group * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % (GROUP_M * grid_n)) % size_m
    pid_n = (tile % (GROUP_M * grid_n)) // size_m
    return pid_m, pid_n


@triton.jit
def _mm_tile(
    x_ptr, w_ptr, x_desc, w_desc, y_ptr, tile, grid_m, grid_n, M, N, K, sxm, swn, sym,
    RUN: tl.constexpr, NUM_RUNS: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
    TMA: tl.constexpr, FUSED: tl.constexpr, OUT: tl.constexpr,
):  # fmt: skip
    """One output tile (``_tile_coords`` places it), stored in ``OUT``."""
    pid_m, pid_n = _tile_coords(tile, grid_m, grid_n, GROUP_M)
    y = _runs_tree(
        x_ptr, w_ptr, x_desc, w_desc, pid_m, pid_n, M, N, K, sxm, swn, RUN, NUM_RUNS, ACC,
        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, TMA, FUSED,
    )  # fmt: skip
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * sym + offs_n[None, :]
    tl.store(ptrs, _to_out(y, ACC, OUT), mask=mask)


@triton.jit
def _group_sum(
    x_ptr, w_ptr, offs_m, offs_n, r0, M, N, K, sxm, swn, RUN: tl.constexpr,
    GROUP: tl.constexpr, ACC: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
    FUSED: tl.constexpr,
):  # fmt: skip
    """Runs ``r0 .. r0 + GROUP - 1`` summed through the binary counter: with ``GROUP`` a power
    of two and ``r0`` a multiple of it, a whole subtree of the counter over all runs, so the
    same adds in the same order."""
    c = _run(x_ptr, w_ptr, offs_m, offs_n, r0, M, N, K, sxm, swn, RUN, ACC, BK, EVEN_K, FUSED)
    if GROUP > 1:
        s0, s1, s2, s3, s4, s5, s6 = _push(c, 1, c, c, c, c, c, c, c, GROUP, ACC)
        for i in tl.static_range(1, GROUP):
            c = _run(
                x_ptr, w_ptr, offs_m, offs_n, r0 + i, M, N, K, sxm, swn, RUN, ACC, BK, EVEN_K,
                FUSED,
            )  # fmt: skip
            s0, s1, s2, s3, s4, s5, s6 = _push(c, i + 1, s0, s1, s2, s3, s4, s5, s6, GROUP, ACC)
        c = _total(s0, s1, s2, s3, s4, s5, s6, GROUP)
    return c


@triton.jit
def _mm_runs(
    x_ptr, w_ptr, ws_ptr, y_ptr, count_ptr, M, N, K, sxm, swn, swr, swm, sym,
    RUN: tl.constexpr, NUM_RUNS: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, GROUP: tl.constexpr,
    FUSED: tl.constexpr, OUT: tl.constexpr,
):  # fmt: skip
    """Small M: program (output tile, r) sums the ``GROUP`` adjacent runs from ``r * GROUP``
    (``_group_sum``), writes that partial to ``ws[r]`` and counts itself in the tile's counter;
    the tile's last program reads the ``NUM_RUNS // GROUP`` partials back in order, combines them
    through the counter (the upper levels of the same tree) and writes ``y``, and resets the
    counter to zero for the next launch. A CTA barrier orders every thread's workspace store
    before the counter's release; the combining loads bypass L1 (``.cg``), which is not coherent
    across SMs."""
    tl.static_assert(NUM_RUNS % GROUP == 0, "GROUP must divide NUM_RUNS (both powers of two)")
    PARTS: tl.constexpr = NUM_RUNS // GROUP
    pid_n = tl.program_id(0)
    r = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c = _group_sum(
        x_ptr, w_ptr, offs_m, offs_n, r * GROUP, M, N, K, sxm, swn, RUN, GROUP, ACC, BLOCK_K,
        EVEN_K, FUSED,
    )  # fmt: skip
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    rows = offs_m.to(tl.int64)[:, None] * swm + offs_n[None, :]
    if PARTS == 1:
        tl.store(
            y_ptr + offs_m.to(tl.int64)[:, None] * sym + offs_n[None, :], _to_out(c, ACC, OUT), mask=mask
        )  # fmt: skip
    else:
        tl.store(ws_ptr + r.to(tl.int64) * swr + rows, c, mask=mask)
        tl.debug_barrier()
        counter = count_ptr + pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(counter, 1, sem="acq_rel") == PARTS - 1:
            tl.atomic_xchg(counter, 0)
            s0 = tl.zeros((BLOCK_M, BLOCK_N), ACC)
            s1 = s0
            s2 = s0
            s3 = s0
            s4 = s0
            s5 = s0
            s6 = s0
            part_stride = swr.to(tl.int64)
            for q in tl.static_range(PARTS):  # unrolled: every load issued up front
                part = tl.load(
                    ws_ptr + q * part_stride + rows, mask=mask, other=0.0, cache_modifier=".cg"
                )  # fmt: skip
                s0, s1, s2, s3, s4, s5, s6 = _push(
                    part, q + 1, s0, s1, s2, s3, s4, s5, s6, PARTS, ACC
                )  # fmt: skip
            y = _to_out(_total(s0, s1, s2, s3, s4, s5, s6, PARTS), ACC, OUT)
            tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * sym + offs_n[None, :], y, mask=mask)
