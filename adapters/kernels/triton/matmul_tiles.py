"""Triton matmul device functions: one K tile's operands and dot (pointer loads or TMA), a
first-level run of tiles, and the binary counter that combines finished runs in the contract's
order (``_push``, ``_total``; ``_runs_tree`` unrolls the ``fixed_runs`` runs at compile time).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .arith import INTERPRET, _add, _round, interpreter_dot


@triton.jit
def _tile_operands(
    x_ptr, w_ptr, offs_m, offs_n, k0, M, N, K, sxm, swn, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    """One K tile's operands ``x[rows, k0:k0+BK]`` and ``w[cols, k0:k0+BK].T`` (zero padded).
    Row offsets are int64: an LM head's ``[tokens, vocab]`` is past 2**31 elements at 16k tokens
    (16,384 x 151,936), where int32 offsets wrap and the access faults. ``EVEN_K`` (K a multiple
    of the tile): no mask along K, which would vary along the contiguous dimension and keep the
    loads from being vectorized; the values are the same."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if EVEN_K:
        a_mask = offs_m[:, None] < M
        b_mask = offs_n[None, :] < N
    else:
        a_mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
        b_mask = (offs_n[None, :] < N) & (offs_k[:, None] < K)
    a = tl.load(
        x_ptr + offs_m.to(tl.int64)[:, None] * sxm + offs_k[None, :], mask=a_mask, other=0.0
    )
    b = tl.load(
        w_ptr + offs_n.to(tl.int64)[None, :] * swn + offs_k[:, None], mask=b_mask, other=0.0
    )
    return a, b


@triton.jit
def _tile_dot(
    x_ptr, w_ptr, offs_m, offs_n, k0, M, N, K, sxm, swn, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    """One K tile: ``x[rows, k0:k0+BK] @ w[cols, k0:k0+BK].T`` in float32 (``_tile_operands``)."""
    a, b = _tile_operands(x_ptr, w_ptr, offs_m, offs_n, k0, M, N, K, sxm, swn, BLOCK_K, EVEN_K)
    if INTERPRET:
        return interpreter_dot(a, b)
    return tl.dot(a, b)


@triton.jit
def _tile_dot_into(
    acc, x_ptr, w_ptr, offs_m, offs_n, k0, M, N, K, sxm, swn, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    """``fixed_runs``: one K tile's products accumulated into the run's float32 ``acc`` by the
    tensor core (``tl.dot(a, b, acc)``: no rounding between the tiles of a run)."""
    a, b = _tile_operands(x_ptr, w_ptr, offs_m, offs_n, k0, M, N, K, sxm, swn, BLOCK_K, EVEN_K)
    if INTERPRET:
        return acc + interpreter_dot(a, b)
    return tl.dot(a, b, acc)


@triton.jit
def _tile_dot_tma(x_desc, w_desc, off_m, off_n, k0):
    """``_tile_dot`` through TMA descriptors: the copy engine zero-fills what lies past M, N or
    K, as the masked loads do; the dot is the same instruction."""
    a = x_desc.load([off_m, k0])
    b = w_desc.load([off_n, k0])
    if INTERPRET:
        return interpreter_dot(a, tl.trans(b))
    return tl.dot(a, b.T)


@triton.jit
def _tile_dot_tma_into(acc, x_desc, w_desc, off_m, off_n, k0):
    """``_tile_dot_into`` through TMA descriptors."""
    a = x_desc.load([off_m, k0])
    b = w_desc.load([off_n, k0])
    if INTERPRET:
        return acc + interpreter_dot(a, tl.trans(b))
    return tl.dot(a, b.T, acc)


@triton.jit
def _run(
    x_ptr, w_ptr, offs_m, offs_n, r, M, N, K, sxm, swn, RUN: tl.constexpr, ACC: tl.constexpr,
    BK: tl.constexpr, EVEN_K: tl.constexpr, FUSED: tl.constexpr,
):  # fmt: skip
    """Run ``r``: its ``RUN`` tiles, each rounded to ``ACC``, added left to right; ``FUSED``
    (``fixed_runs``): accumulated in one float32 dot, rounded once to ``ACC``."""
    t0 = r * RUN
    if FUSED:
        acc = tl.zeros((offs_m.shape[0], offs_n.shape[0]), tl.float32)
        for j in range(RUN):
            acc = _tile_dot_into(
                acc, x_ptr, w_ptr, offs_m, offs_n, (t0 + j) * BK, M, N, K, sxm, swn, BK, EVEN_K
            )  # fmt: skip
        return _round(acc, ACC)
    acc = _round(
        _tile_dot(x_ptr, w_ptr, offs_m, offs_n, t0 * BK, M, N, K, sxm, swn, BK, EVEN_K), ACC
    )
    for j in range(1, RUN):
        part = _tile_dot(x_ptr, w_ptr, offs_m, offs_n, (t0 + j) * BK, M, N, K, sxm, swn, BK, EVEN_K)
        acc = _add(acc, _round(part, ACC), ACC)
    return acc


@triton.jit
def _push(c, n, s0, s1, s2, s3, s4, s5, s6, NUM_RUNS: tl.constexpr, ACC: tl.constexpr):
    """Finished run ``n`` (1-based) into the binary counter: ``s<l>`` holds the sum of ``2**l``
    consecutive runs; a level that is full adds its left neighbour and carries up. ``NUM_RUNS`` is
    a power of two (<= 64): after run ``NUM_RUNS`` the whole sum, ``((r0 + r1) + (r2 + r3)) ...``,
    is at level log2(NUM_RUNS). The static ``NUM_RUNS >=`` guards keep unused levels out of the
    compiled code."""
    if NUM_RUNS >= 2:
        if n % 2 != 0:
            s0 = c
        else:
            c = _add(s0, c, ACC)
            if NUM_RUNS >= 4:
                if n % 4 != 0:
                    s1 = c
                else:
                    c = _add(s1, c, ACC)
                    if NUM_RUNS >= 8:
                        if n % 8 != 0:
                            s2 = c
                        else:
                            c = _add(s2, c, ACC)
                            if NUM_RUNS >= 16:
                                if n % 16 != 0:
                                    s3 = c
                                else:
                                    c = _add(s3, c, ACC)
                                    if NUM_RUNS >= 32:
                                        if n % 32 != 0:
                                            s4 = c
                                        else:
                                            c = _add(s4, c, ACC)
                                            if NUM_RUNS >= 64:
                                                if n % 64 != 0:
                                                    s5 = c
                                                else:
                                                    s6 = _add(s5, c, ACC)
                                            else:
                                                s5 = c
                                    else:
                                        s4 = c
                            else:
                                s3 = c
                    else:
                        s2 = c
            else:
                s1 = c
    else:
        s0 = c
    return s0, s1, s2, s3, s4, s5, s6


@triton.jit
def _total(s0, s1, s2, s3, s4, s5, s6, NUM_RUNS: tl.constexpr):
    """The counter's whole sum: its top level."""
    out = s0
    if NUM_RUNS == 2:
        out = s1
    if NUM_RUNS == 4:
        out = s2
    if NUM_RUNS == 8:
        out = s3
    if NUM_RUNS == 16:
        out = s4
    if NUM_RUNS == 32:
        out = s5
    if NUM_RUNS == 64:
        out = s6
    return out


@triton.jit
def _step(
    part, t, run, s0, s1, s2, s3, s4, s5, s6, RUN: tl.constexpr, NUM_RUNS: tl.constexpr,
    ACC: tl.constexpr,
):  # fmt: skip
    """K tile ``t``'s rounded dot into the current run; a finished run into the counter."""
    if t % RUN == 0:
        run = part
    else:
        run = _add(run, part, ACC)
    if t % RUN == RUN - 1:
        s0, s1, s2, s3, s4, s5, s6 = _push(
            run, t // RUN + 1, s0, s1, s2, s3, s4, s5, s6, NUM_RUNS, ACC
        )  # fmt: skip
    return run, s0, s1, s2, s3, s4, s5, s6


@triton.jit
def _runs_tree(
    x_ptr, w_ptr, x_desc, w_desc, pid_m, pid_n, M, N, K, sxm, swn, RUN: tl.constexpr,
    NUM_RUNS: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, TMA: tl.constexpr, FUSED: tl.constexpr,
):  # fmt: skip
    """All K tiles of output tile (``pid_m``, ``pid_n``) in one (pipelined) loop, through
    ``_step``; each tile's operands by pointer loads or, with ``TMA``, through the descriptors."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    s0 = tl.zeros((BLOCK_M, BLOCK_N), ACC)
    s1 = s0
    s2 = s0
    s3 = s0
    s4 = s0
    s5 = s0
    s6 = s0
    run = s0
    if FUSED:
        # fixed_runs: the runs unrolled at compile time, each one pipelined loop whose tiles
        # accumulate in the dot's float32 accumulator, and the push into the counter resolved
        # at compile time: no runtime branch in the loop, and a counter level is live only
        # between the runs that fill and empty it. One runtime loop over all tiles with the
        # push under ``if`` (the form before 2026-12-04) kept every level loop carried and ran
        # 6.5-8x cuBLAS time on an H200; this form 1.2-1.8x (BENCHMARKS.md, "v3 linear").
        for r in tl.static_range(NUM_RUNS):
            fused = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for j in tl.range(RUN):
                k0 = (r * RUN + j) * BLOCK_K
                if TMA:
                    fused = _tile_dot_tma_into(
                        fused, x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k0
                    )  # fmt: skip
                else:
                    fused = _tile_dot_into(
                        fused, x_ptr, w_ptr, offs_m, offs_n, k0, M, N, K, sxm, swn, BLOCK_K,
                        EVEN_K,
                    )  # fmt: skip
            s0, s1, s2, s3, s4, s5, s6 = _push(
                _round(fused, ACC), r + 1, s0, s1, s2, s3, s4, s5, s6, NUM_RUNS, ACC
            )  # fmt: skip
    else:
        for t in range(0, RUN * NUM_RUNS):
            if TMA:
                p = _tile_dot_tma(x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, t * BLOCK_K)
            else:
                p = _tile_dot(
                    x_ptr, w_ptr, offs_m, offs_n, t * BLOCK_K, M, N, K, sxm, swn, BLOCK_K, EVEN_K
                )  # fmt: skip
            run, s0, s1, s2, s3, s4, s5, s6 = _step(
                _round(p, ACC), t, run, s0, s1, s2, s3, s4, s5, s6, RUN, NUM_RUNS, ACC
            )  # fmt: skip
    return _total(s0, s1, s2, s3, s4, s5, s6, NUM_RUNS)
