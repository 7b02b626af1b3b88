"""Launch shapes of the Triton matmul: how a launch is cut (output tile, warps, stages, programs
per SM, runs per program), never what an output element computes. The shipped shapes, the
measurements that chose them, and the per-call choosers that need no device query
(``small_shape``, ``persistent_shape_for_fused``); ``matmul.persistent_shape`` picks for a call.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import triton

from .arith import INTERPRET


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
