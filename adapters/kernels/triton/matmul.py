"""Triton invariant matmul: ``y_MN = x_MK @ w_NK.T`` in the contract's tile order.

Per ``BLOCK_M x BLOCK_N`` output tile: every ``k_block``-wide K tile is one ``tl.dot`` of bf16
operands with float32 accumulation (what SGLang's ``matmul_tp_persistent`` and a per-tile
``torch.mm(..., out_dtype=float32)`` compute), rounded to the accumulation dtype; the tiles of a
first-level run are added one after another, and finished runs are combined by a binary counter
(adjacent pairwise, an odd leftover carried, as ``matmul.pairwise_sum``). Every add is float32 of
the two rounded values, rounded again, as torch's bf16 add. Under ``fixed_runs`` (``FUSED``) a
run's tiles accumulate in the dot's own float32 accumulator (``tl.dot(a, b, acc)``), the runs
are unrolled at compile time (``_runs_tree``), the counter adds float32 runs with an opaque
``add.rn.f32`` (``_ieee_add`` says why), and the sum is rounded once to the output dtype in the
epilogue.

Invariances: each output element's arithmetic (its K tiles, their dots, the order) never changes
with M, N, the call or the launch shape, so a row's bits depend on that row and its column's
weights only (batch and N invariance) and a rank holding a whole subtree of runs computes that
subtree (TP). The launch shape (``LaunchShape``: output tile, warps, stages, programs per SM,
runs per program) is free for speed as long as the tile dot stays the same instruction and the
compiler compiles it right: ``benchmarks/tune_matmul.py`` checks every shape's bits against the
shipped one before timing it. One shape that is not shipped failed that check on an H200 (a
persistent 64 x 64 tile with 8 warps and pointer loads, one run: BENCHMARKS.md, not diagnosed;
``test_triton_matmul_eight_warp_64_tile_is_wrong_on_one_run`` pins it).
Two launches, same arithmetic per output:

* ``_mm_persistent`` (large M): ``programs_per_sm`` programs per SM, each looping over output
  tiles, every K tile of a tile in one pipelined loop; the operand tiles come through TMA
  descriptors (the shipped path, where they fit) or pointer loads, and the output tile follows
  the counter's depth (``persistent_shape``).
* ``_mm_runs`` (small M: where output tiles alone cannot fill the GPU, and every call of at
  most ``SMALL_ROWS`` rows whose K holds more than one run): one program per (output tile, run)
  or per (output tile, a power-of-two group of adjacent runs: a subtree of the counter), so each
  weight is read once; a program writes its sum to a workspace and the last program of a tile to
  finish (an atomic counter per tile) combines them in the fixed order. One launch: no extra
  kernel per tree level.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .._dtypes import dtype_of
from .._streams import stream_key
from ..matmul import _run_length, fixed_run_width, reference_matmul
from ..policy import KernelPolicy

# Triton's CPU interpreter (CI): same kernels, each tile's dot through ``interpreter_dot``.
INTERPRET: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")

_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@dataclass(frozen=True)
class LaunchShape:
    """How one launch is cut; never what an output element computes."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    programs_per_sm: int = 1  # persistent launch only
    # persistent launch only: operand tiles come in through TMA descriptors (one thread issues
    # each tile's copy; no per-thread address registers), where ``tma_fits`` allows it
    tma: bool = False
    # per-run launch only: adjacent runs one program sums (a power of two: a whole subtree of
    # the counter, so the same adds in the same order), so fewer partial sums go through memory
    runs_per_program: int = 1

    def __post_init__(self):
        rpp = self.runs_per_program
        if rpp < 1 or rpp & (rpp - 1):
            raise ValueError(f"runs_per_program must be a power of two, got {rpp}")


# Shipped persistent shapes: the fastest of benchmarks/tune_matmul.py's sweeps on an H200
# (BENCHMARKS.md), where every shape swept gave the same bits as every other on every case. The
# bound is the output tile: a dot of 64 x 64 reads and writes as many shared-memory bytes as a
# 128 x 128 one for a quarter of the FLOPs, and the tile's state (its float32 dot, the run and the
# counter's levels in bf16) must fit in registers. So 128 x 128 where the counter is shallow
# (at most LARGE_MAX_RUNS runs: 236 registers, no spill) and there are enough tiles to fill
# LARGE_WAVES waves of SMs; one 64 x 128 program where it is deep (PERSISTENT_DEEP); otherwise two
# programs of 64 x 64 per SM (while one rounds and adds its partial, the other's dot runs). All
# through TMA; pointer loads where no descriptor fits.
PERSISTENT = LaunchShape(
    block_m=64, block_n=64, num_warps=4, num_stages=3, programs_per_sm=2, tma=True
)
PERSISTENT_LARGE = LaunchShape(block_m=128, block_n=128, num_warps=8, num_stages=3, tma=True)
# Where the counter is deep (DEEP_FROM_RUNS runs or more: o_proj at K = 4096 has 16), one program
# of 64 x 128 with 8 warps per SM (147 KiB of shared memory; 180 registers at 16 runs, 212 at 32,
# no spill): half the shared-memory traffic per FLOP of two 64 x 64 programs, and a register file
# that still holds the counter. tune_matmul.py on an H200, 16 runs (o_proj, N x K = 2560 x 4096):
# 2.06x / 2.06x / 2.00x cuBLAS time at M = 4096 / 8192 / 16384, against 2.15x / 2.31x / 2.43x for
# PERSISTENT; at 8 runs the two were even (1.98-2.11x), so shallower counters keep PERSISTENT.
PERSISTENT_DEEP = LaunchShape(block_m=64, block_n=128, num_warps=8, num_stages=3, tma=True)
DEEP_FROM_RUNS = 16
PERSISTENT_POINTER = LaunchShape(
    block_m=64, block_n=64, num_warps=4, num_stages=3, programs_per_sm=2
)
LARGE_MAX_RUNS = 4
LARGE_WAVES = 3
# Per-run launch, by M (``small_shape``): at most SMALL_ROWS rows take the 16-row tile (less
# padding, more programs), and take this launch whenever K holds more than one run: a 64-row
# persistent tile would waste three quarters of its rows and walk all of K in one program. Wider
# calls take 64 x 64 tiles, and where the counter is deep (GROUP_FROM_RUNS runs or more) each
# program sums two adjacent runs, so a tile's last program adds half as many partials.
# tune_matmul.py under CUDA graphs, H200, 2026-12-02 (BENCHMARKS.md): o_proj (16 runs) at M = 64
# 1.34x cuBLAS grouped, 1.44x not, 1.64x with the 8 warps shipped before; the 4-run shapes were
# slower grouped. At M = 1 and 16, 16 x 64 tiles: 0.92-1.27x on gate/up, q_proj and o_proj,
# where 16 x 32 took 0.99-1.62x.
SMALL_ROWS = 16
SMALL_M = LaunchShape(block_m=16, block_n=64, num_warps=4, num_stages=3)
SMALL_M_WIDE = LaunchShape(block_m=64, block_n=64, num_warps=4, num_stages=3)
GROUP_FROM_RUNS = 16
GROUP_M = 8


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
def interpreter_dot(a, b):
    """The interpreter's stand-in for a tensor-core dot ``a @ b``: every product exact in
    float64, summed along K per output element, rounded once to float32. A row's result never
    depends on the other rows of the tile, as on the GPU; the interpreter's own ``tl.dot``
    (numpy's matmul) does not promise that (its BLAS blocks rows), and it misreads bf16 bits."""
    prod = a.to(tl.float64)[:, :, None] * b.to(tl.float64)[None, :, :]
    return tl.sum(prod, 1).to(tl.float32)


@triton.jit
def _round(v, ACC: tl.constexpr):
    """float32 ``v`` rounded to nearest-even in ``ACC`` (the GPU default, spelled out: the
    interpreter truncates otherwise)."""
    if ACC == tl.float32:
        return v
    if INTERPRET and ACC == tl.bfloat16:  # the interpreter's cast rounds ties up: do it by bits
        u = v.to(tl.uint32, bitcast=True)
        u = u + 0x7FFF + ((u >> 16) & 1)
        return (u >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return v.to(ACC, fp_downcast_rounding="rtne")


@triton.jit
def _to_out(v, ACC: tl.constexpr, OUT: tl.constexpr):
    """A finished ``ACC`` sum in the output dtype ``OUT``: unchanged where they agree, else
    rounded once (``_round``: float32 to bf16 nearest even, as torch's ``.to``); a bf16 sum
    widened to float32 is exact."""
    if OUT == ACC:
        return v
    elif OUT == tl.float32:
        return v.to(tl.float32)
    else:
        return _round(v, OUT)


@triton.jit
def _add(a, b, ACC: tl.constexpr):
    """``a + b`` as torch adds two ``ACC`` tensors: in float32, rounded once to ``ACC``. A float32
    sum is one IEEE add (``_ieee_add``), never folded into a dot's accumulator."""
    if ACC == tl.float32:
        return _ieee_add(a, b)
    return _round(a.to(tl.float32) + b.to(tl.float32), ACC)


@triton.jit
def _ieee_add(a, b):
    """``a + b`` in float32, round to nearest, as an opaque instruction. Triton rewrites
    ``dot(x, y, 0) + c`` into ``dot(x, y, c)`` (the tensor core adds ``c`` in its accumulator,
    with other bits); under ``fixed_runs`` a run of one tile is such a dot, and the counter's add
    of it was folded in some launches and not in others (an H200, 2026-12-03:
    ``benchmarks/diag_fixed_runs.py``: one-tile runs differed between launches, longer runs
    agreed). With ``add.rn.f32`` the add stays an add. The interpreter has no PTX."""
    if INTERPRET:
        return a + b
    return tl.inline_asm_elementwise(
        "add.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def _ieee_mul(a, b):
    """``a * b`` in float32, round to nearest, as an opaque instruction: ptxas contracts a plain
    ``mul.f32`` followed by an add into one FMA (one rounding, not torch's two)."""
    if INTERPRET:
        return a * b
    return tl.inline_asm_elementwise(
        "mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
    )


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


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def _major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def _programs(device: torch.device) -> int:
    return _num_sms(device.index or 0) if device.type == "cuda" else 4


_COUNTERS: dict[tuple, torch.Tensor] = {}
_RETIRED_COUNTERS: list[torch.Tensor] = []
# Tile counters first allocated: one per 16 x 64 output tile of a 4M-column decode call (an LM
# head of 151,936 columns needs 2,374), so the buffer is not replaced in practice.
COUNTERS = 1 << 16


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """``n`` zeroed int32 tile counters for ``_mm_runs``, kept per (device, stream): each launch
    leaves them at zero, and launches on one stream run one after another, so they never share
    a counter while running. A buffer outgrown by a larger call is kept alive, never freed: a
    CUDA graph captured earlier (SGLang's decode) still holds its address."""
    key = stream_key(device)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _RETIRED_COUNTERS.append(buf)
        buf = torch.zeros(max(n, COUNTERS), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


def _launch(
    x_MK: torch.Tensor,
    w_NK: torch.Tensor,
    k_block: int,
    run: int,
    acc: torch.dtype,
    persistent: LaunchShape | None = None,
    small: LaunchShape | None = None,
    fused: bool = False,
    out: torch.dtype | None = None,
) -> torch.Tensor:
    """``runs`` = K tiles / ``run``; ``fused`` (``fixed_runs``): a run's tiles accumulate in one
    float32 dot instead of being rounded and added one by one. ``out``: the output's dtype
    (default ``acc``), to which the finished sum is rounded once inside the kernel, as
    ``.to(out)`` rounds it (nearest even): no float32 ``[M, N]`` round trip through memory."""
    out = out or acc
    M, K = x_MK.shape
    N = w_NK.shape[0]
    runs = max(1, math.ceil(K / k_block)) // run
    small = small or small_shape(M, runs, fused)
    split = persistent or PERSISTENT  # the per-run launch takes what this tile cannot fill
    grid_m, grid_n = triton.cdiv(M, split.block_m), triton.cdiv(N, split.block_n)
    progs = _programs(x_MK.device)
    y_MN = torch.empty((M, N), dtype=out, device=x_MK.device)
    if M == 0 or N == 0:  # nothing to launch (an empty batch)
        return y_MN
    if runs > 1 and (grid_m * grid_n < progs or M <= SMALL_ROWS):
        gm, gn = triton.cdiv(M, small.block_m), triton.cdiv(N, small.block_n)
        group = min(small.runs_per_program, runs)
        if runs % group:  # ``supports`` admits powers of two only; a direct call may not
            raise ValueError(f"{runs} runs cannot be cut into groups of {group}: use powers of two")
        parts = runs // group
        # one part: the program writes y itself, and the workspace is never read
        ws_RMN = (
            y_MN.unsqueeze(0) if parts == 1
            else torch.empty((parts, M, N), dtype=acc, device=x_MK.device)
        )  # fmt: skip
        _mm_runs[(gn, parts, gm)](
            x_MK, w_NK, ws_RMN, y_MN, _counters(x_MK.device, gm * gn), M, N, K, x_MK.stride(0),
            w_NK.stride(0), ws_RMN.stride(0), ws_RMN.stride(1), y_MN.stride(0), run, runs,
            _TL[acc], small.block_m, small.block_n, k_block, K % k_block == 0, group, fused,
            _TL[out], num_warps=small.num_warps,
            num_stages=small.num_stages,
        )  # fmt: skip
        return y_MN
    persistent = persistent or persistent_shape(x_MK, w_NK, runs, fused)
    grid_m, grid_n = triton.cdiv(M, persistent.block_m), triton.cdiv(N, persistent.block_n)
    progs = min(progs * persistent.programs_per_sm, grid_m * grid_n)
    iters = triton.next_power_of_2(triton.cdiv(grid_m * grid_n, progs))
    tma = persistent.tma and tma_fits(x_MK, w_NK)
    x_desc = _descriptor(x_MK, persistent.block_m, k_block) if tma else None
    w_desc = _descriptor(w_NK, persistent.block_n, k_block) if tma else None
    _mm_persistent[(progs,)](
        None if tma else x_MK, None if tma else w_NK, x_desc, w_desc, y_MN, M, N, K,
        x_MK.stride(0), w_NK.stride(0), y_MN.stride(0), run, runs, _TL[acc], progs, iters,
        persistent.block_m, persistent.block_n, k_block, GROUP_M, K % k_block == 0, tma, fused,
        _TL[out], num_warps=persistent.num_warps, num_stages=persistent.num_stages,
    )  # fmt: skip
    return y_MN


# fixed_runs (v3): the per-run launch takes 64 x 64 tiles, two runs a program: the sweep's best
# (tune_matmul.py under CUDA graphs, H200, 2026-12-03: 1.28x cuBLAS geometric mean over the
# Qwen3-4B projections at M = 1, 16, 64; 16-row tiles 1.29-1.31x).
SMALL_FUSED = LaunchShape(block_m=64, block_n=64, num_warps=4, num_stages=3, runs_per_program=2)
# The persistent launch, with the runs unrolled (``_runs_tree``): 128 x 128 with 8 warps and 4
# stages where such tiles fill the GPU, the fastest of benchmarks/tune_fixed_runs.py on an H200
# (2026-12-04; Qwen3-4B projections at M = 4096 and 8192: 1.21-1.80x cuBLAS time, 5 stages
# within 4%; 128 x 64 and 64 x 128 2.4-3.0x; 128 x 256 spills 412 registers, 4.4-5.9x). ptxas
# spills 20 registers of the counter's levels, which live between runs, not in the dot's loop.
# Fewer tiles than SMs: 64 x 64, two programs per SM (2.4-2.7x on those shapes, all SMs busy).
PERSISTENT_FUSED = LaunchShape(block_m=128, block_n=128, num_warps=8, num_stages=4, tma=True)
PERSISTENT_FUSED_NARROW = LaunchShape(
    block_m=64, block_n=64, num_warps=4, num_stages=4, programs_per_sm=2, tma=True
)
# One run (a matmul whose K no layout splits, under matmul_column_k_runs: 1): no counter level is
# live, only the dot's float32 accumulator (128 registers a thread at 8 warps), so the tile can be
# 128 x 256, where shared memory feeds the tensor cores at full rate (BENCHMARKS.md, "the output
# tile"). benchmarks/linear_ceiling.py on an H100 (2026-12-07), Qwen3-4B projections at M = 4096
# and 8192: 0.83-1.10x cuBLAS throughput with 4 stages (128 x 128: 0.78-0.92x; 256 x 128:
# 0.75-0.99x; 3 stages within 5 % either way). It is taken where its tiles keep at least
# ONE_RUN_FILL of the SMs busy: k/v_proj at M = 4096 has 128 such tiles for 132 SMs, and ran at
# 1.00x as 128 x 256 against 0.80x as 128 x 128 (one wave either way).
PERSISTENT_FUSED_ONE_RUN = LaunchShape(
    block_m=128, block_n=256, num_warps=8, num_stages=4, tma=True
)
ONE_RUN_FILL = 0.9
# One run at M <= ONE_RUN_SMALL_ROWS: 16 x 32 tiles, four programs an SM. One run gives no K split
# to spread over the SMs, so the output tiles are the only parallelism: benchmarks/bench_v4_shapes.py
# on an H100 (call Q, 2026-12-07; Qwen3-4B's column projections under CUDA graphs, every candidate
# first checked bit-equal to the 128 x 256 rows) put 16 x 32 at or below the 64 x 64 tile in all
# six cases at M = 1 and 16 (q 1.30 / 1.29x cuBLAS against 1.33 / 1.31x, k/v 1.56 / 1.57 against
# 1.60 / 1.59, gate/up 1.08 / 1.08 against 1.19 / 1.12); at M = 64 it lost (1.33-1.76x), so 64 x 64
# stays there.
PERSISTENT_FUSED_ONE_RUN_SMALL_M = LaunchShape(
    block_m=16, block_n=32, num_warps=4, num_stages=4, programs_per_sm=4, tma=True
)
ONE_RUN_SMALL_ROWS = 16


def small_shape(M: int, runs: int, fused: bool = False) -> LaunchShape:
    """The shipped per-run launch shape for ``M`` rows and ``runs`` runs (``SMALL_M`` and its
    neighbours say why); the shape changes no bit, only the time (``fused``: ``SMALL_FUSED``)."""
    if fused:
        return SMALL_FUSED if runs >= 2 else replace(SMALL_FUSED, runs_per_program=1)
    if M <= SMALL_ROWS:
        return SMALL_M
    if runs >= GROUP_FROM_RUNS:
        return replace(SMALL_M_WIDE, runs_per_program=2)
    return SMALL_M_WIDE


def persistent_shape_for_fused(
    M: int = 1 << 20, N: int = 1 << 20, programs: int = 132, runs: int = 2
) -> LaunchShape:
    """fixed_runs' persistent shape for an ``M x N`` output (``PERSISTENT_FUSED`` says why):
    128 x 128 tiles where there are at least as many as ``programs`` (one run: 128 x 256 where
    those fill ``ONE_RUN_FILL`` of them, ``PERSISTENT_FUSED_ONE_RUN``; 16 x 32 at M <=
    ``ONE_RUN_SMALL_ROWS``), else 64 x 64. The interpreter (CI) cannot hold a 128 x 128 x 64
    float64 product: it runs the narrow tile."""

    def fills(shape: LaunchShape, share: float = 1.0) -> bool:
        return triton.cdiv(M, shape.block_m) * triton.cdiv(N, shape.block_n) >= share * programs

    if INTERPRET:
        return PERSISTENT_FUSED_NARROW
    if runs == 1 and fills(PERSISTENT_FUSED_ONE_RUN, ONE_RUN_FILL):
        return PERSISTENT_FUSED_ONE_RUN
    if runs == 1 and M <= ONE_RUN_SMALL_ROWS:
        return PERSISTENT_FUSED_ONE_RUN_SMALL_M
    return PERSISTENT_FUSED if fills(PERSISTENT_FUSED) else PERSISTENT_FUSED_NARROW


def persistent_shape(
    x_MK: torch.Tensor, w_NK: torch.Tensor, runs: int, fused: bool = False
) -> LaunchShape:
    """The shipped persistent launch shape for this call (``PERSISTENT`` and its neighbours say
    why); the shape changes no bit, only the time (``fused``: ``persistent_shape_for_fused``)."""
    if not tma_fits(x_MK, w_NK):
        return PERSISTENT_POINTER
    M, N = x_MK.shape[0], w_NK.shape[0]
    if fused:
        return persistent_shape_for_fused(M, N, _programs(x_MK.device), runs)
    waves = LARGE_WAVES * _programs(x_MK.device)

    def fills(shape: LaunchShape) -> bool:  # enough tiles for LARGE_WAVES waves of programs
        return triton.cdiv(M, shape.block_m) * triton.cdiv(N, shape.block_n) >= waves

    # the interpreter (CI) cannot hold a 128 x 128 x 128 float64 product: it runs the 64 x 64 tile
    if not INTERPRET and runs <= LARGE_MAX_RUNS and fills(PERSISTENT_LARGE):
        return PERSISTENT_LARGE
    if runs >= DEEP_FROM_RUNS and fills(PERSISTENT_DEEP):
        return PERSISTENT_DEEP
    return PERSISTENT


def tma_fits(x_MK: torch.Tensor, w_NK: torch.Tensor) -> bool:
    """Both operands can be TMA descriptors (``descriptor_fits``)."""
    return descriptor_fits(x_MK) and descriptor_fits(w_NK)


def descriptor_fits(t: torch.Tensor) -> bool:
    """A TMA descriptor over ``t`` viewed as rows: a Hopper-or-later GPU (or the interpreter),
    contiguous elements within a row, 16-byte aligned row stride and base address."""
    if t.device.type == "cuda" and _major(t.device.index or 0) < 9:
        return False
    return (
        t.stride(-1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
    )


def _descriptor(t: torch.Tensor, rows: int, cols: int) -> TensorDescriptor:
    return TensorDescriptor(t, shape=list(t.shape), strides=list(t.stride()),
                            block_shape=[rows, cols])  # fmt: skip


def _tiles_per_run(k: int, kp: KernelPolicy, order: str) -> tuple[int, bool]:
    """(K tiles per run, fused) for ``order``: ``fixed_runs`` has ``k_runs(kp)`` fused runs
    (``fixed_run_width``); the other orders round every tile (``_run_length``)."""
    if order == "fixed_runs":
        return fixed_run_width(k, kp) // kp.matmul_k_block, True
    return _run_length(order, max(1, math.ceil(k / kp.matmul_k_block))), False


def supports(x_MK: torch.Tensor, w_NK: torch.Tensor, kp: KernelPolicy, order: str) -> bool:
    """Tensor-core tiles need 16-bit operands of one dtype; the counter needs a power-of-two run
    count (always so for ``sglang_first_level`` and ``fixed_runs``; ``binary`` over a
    non-power-of-two tile count runs the reference)."""
    acc = dtype_of(kp.matmul_accumulation_dtype)
    if x_MK.dtype not in (torch.bfloat16, torch.float16) or w_NK.dtype != x_MK.dtype:
        return False
    if acc not in _TL or kp.matmul_k_block % 16:
        return False
    T = max(1, math.ceil(x_MK.shape[-1] / kp.matmul_k_block))
    runs = T // _tiles_per_run(x_MK.shape[-1], kp, order)[0]
    return runs & (runs - 1) == 0 and runs <= 64


class _Matmul(torch.autograd.Function):
    """Forward: the Triton kernel. Backward: the exact gradient formulas, ``dX = dY W`` and
    ``dW = dY^T X`` (float32 GEMMs; gradients need not be bitwise)."""

    @staticmethod
    def forward(ctx, x_MK, w_NK, k_block, run, acc, fused, out):
        ctx.save_for_backward(x_MK, w_NK)
        return _launch(x_MK, w_NK, k_block, run, acc, fused=fused, out=out)

    @staticmethod
    def backward(ctx, g_MN):
        x_MK, w_NK = ctx.saved_tensors
        g = g_MN.float()
        dx = (g @ w_NK.float()).to(x_MK.dtype) if ctx.needs_input_grad[0] else None
        dw = (g.T @ x_MK.float()).to(w_NK.dtype) if ctx.needs_input_grad[1] else None
        return dx, dw, None, None, None, None, None


def triton_matmul(
    x_MK: torch.Tensor,
    w_NK: torch.Tensor,
    kp: KernelPolicy,
    *,
    out_dtype: torch.dtype | None = None,
    tile_order: str | None = None,
) -> torch.Tensor:
    """The Triton backend of ``invariant_matmul`` (same signature). Operands it cannot put on
    tensor cores (float32/float64 gradient checks) run the reference."""
    order = tile_order or kp.matmul_tile_order
    if not supports(x_MK, w_NK, kp, order):
        return reference_matmul(x_MK, w_NK, kp, out_dtype=out_dtype, tile_order=tile_order)
    lead = x_MK.shape[:-1]
    x2 = x_MK.reshape(-1, x_MK.shape[-1]).contiguous()
    w2 = w_NK.contiguous()
    acc = dtype_of(kp.matmul_accumulation_dtype)
    run, fused = _tiles_per_run(x2.shape[1], kp, order)
    # fixed_runs rounds its float32 sum once, in the kernel's epilogue, to the caller's dtype
    out = (out_dtype or x_MK.dtype) if fused and (out_dtype or x_MK.dtype) in _TL else acc
    if torch.is_grad_enabled() and (x2.requires_grad or w2.requires_grad):
        y_MN = _Matmul.apply(x2, w2, kp.matmul_k_block, run, acc, fused, out)
    else:  # rollout and logprob passes: no autograd node (host time counts at decode sizes)
        y_MN = _launch(x2, w2, kp.matmul_k_block, run, acc, fused=fused, out=out)
    return y_MN.to(out_dtype or x_MK.dtype).reshape(*lead, w_NK.shape[0])
