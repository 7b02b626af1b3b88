"""How fast can a Triton GEMM be on the v3 linear's shapes, with and without the contract's runs?

Issue 32 asks the v3 invariant linear for >= 0.85x cuBLAS throughput at M = 4096 / 8192 on the
Qwen3-4B projections. This script separates what Triton itself reaches from what the contract
costs, in one process, against ``F.linear`` (cuBLAS) on the same tensors:

* ``plain``: a plain Triton GEMM, one float32 accumulator over the whole K (no runs, no tree),
  TMA loads, at several tiles, persistent (one program per SM) and one-program-per-tile. It is
  batch-invariant (no split-K, a tile fixed by the launch) but not TP-invariant for a row-parallel
  layer: this is the ceiling for any contract, not a contract kernel. Its output is checked against
  cuBLAS to a tolerance only (another summation order).
* ``runs=R``: the v3 structure (``tune_fixed_runs.static_launch``: R runs unrolled, each one
  pipelined float32 dot loop, a float32 binary tree over runs, rounded once) at 128 x 128, with
  ``matmul_k_runs`` set to R. R = 8 is what ``qwen3_dense_true_on_policy_v3`` ships; R = 8 rows are
  checked bit for bit against the shipped ``triton_matmul``; other R against ``triton_matmul`` under
  the same replaced policy. Fewer runs mean fewer run boundaries but a lower TP limit (a row-parallel
  rank must hold whole runs: TP <= R).

Prints one table (time as a multiple of cuBLAS time, throughput = its inverse) and writes every
row with ``--json``.

    python3 benchmarks/linear_ceiling.py --json $OUT/linear_ceiling.json        # CUDA
    TRITON_INTERPRET=1 python3 benchmarks/linear_ceiling.py --small              # CPU: checks only
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tune_fixed_runs as tfr

from contractgen.adapters.kernels.policy import kernel_policy
from contractgen.adapters.kernels.triton import matmul as tm

PLAIN = [  # (block_m, block_n, block_k, warps, stages)
    (128, 128, 64, 8, 4),
    (128, 256, 64, 8, 3),
    (128, 256, 64, 8, 4),
    (256, 128, 64, 8, 3),
]
SMALL_PLAIN = [(64, 64, 64, 4, 2)]
RUNS = [8, 4, 2]


@triton.jit
def _plain_tile(x_desc, w_desc, off_m, off_n, KT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for t in tl.range(0, KT, num_stages=STAGES):
        a = x_desc.load([off_m, t * BLOCK_K])
        b = w_desc.load([off_n, t * BLOCK_K])
        if tm.INTERPRET:
            acc = acc + tm.interpreter_dot(a, tl.trans(b))
        else:
            acc = tl.dot(a, b.T, acc)
    return acc


@triton.jit
def _plain_persistent(
    x_desc, w_desc, y_ptr, M, N, KT: tl.constexpr, sym, NUM_PROGS: tl.constexpr, ITERS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr, OUT: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    for i in range(ITERS):
        tile = pid + i * NUM_PROGS
        if tile < grid_m * grid_n:
            pid_m, pid_n = tm._tile_coords(tile, grid_m, grid_n, GROUP_M)
            acc = _plain_tile(x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, KT, BLOCK_M, BLOCK_N,
                              BLOCK_K, STAGES)  # fmt: skip
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * sym + offs_n[None, :],
                     tm._round(acc, OUT), mask=mask)  # fmt: skip


@triton.jit
def _plain_grid(
    x_desc, w_desc, y_ptr, M, N, KT: tl.constexpr, sym, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr, OUT: tl.constexpr,
):  # fmt: skip
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tm._tile_coords(tl.program_id(0), grid_m, grid_n, GROUP_M)
    acc = _plain_tile(x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, KT, BLOCK_M, BLOCK_N,
                      BLOCK_K, STAGES)  # fmt: skip
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * sym + offs_n[None, :],
             tm._round(acc, OUT), mask=mask)  # fmt: skip


def plain_launch(x, w, bm, bn, bk, warps, stages, persistent):
    M, K = x.shape
    assert K % bk == 0, "whole K tiles only"
    N = w.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    xd = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, bk])
    wd = TensorDescriptor(w, list(w.shape), list(w.stride()), [bn, bk])
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    if persistent:
        progs = min(tm._programs(x.device), tiles)
        k = _plain_persistent[(progs,)](xd, wd, y, M, N, K // bk, y.stride(0), progs,
                                        triton.cdiv(tiles, progs), bm, bn, bk,
                                        tm.GROUP_M, stages, tm._TL[x.dtype], num_warps=warps, num_stages=stages)  # fmt: skip
    else:
        k = _plain_grid[(tiles,)](xd, wd, y, M, N, K // bk, y.stride(0), bm, bn, bk, tm.GROUP_M, stages,
                                  tm._TL[x.dtype], num_warps=warps, num_stages=stages)  # fmt: skip
    tfr.LAST_COMPILED["regs"] = getattr(k, "n_regs", None)
    tfr.LAST_COMPILED["spills"] = getattr(k, "n_spills", None)
    return y


def with_runs(kp, runs: int):
    """The v3 policy with ``matmul_k_runs`` replaced (a what-if: no contract ships R != 8)."""
    return dataclasses.replace(kernel_policy(kp), matmul_k_runs=runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="small shapes (CPU interpreter)")
    ap.add_argument("--ms", default="4096,8192", help="row counts M")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    kp8 = tfr.load_target("sglang").schema.kernel_policy_for(tfr.CONTRACT)
    cuda = torch.cuda.is_available() and not tm.INTERPRET
    dev = "cuda" if cuda else "cpu"
    shapes = [("small", 128, 1024)] if args.small else tfr.SHAPES
    ms = [128] if args.small else [int(m) for m in args.ms.split(",")]
    plains = SMALL_PLAIN if args.small else PLAIN
    run_tile = (64, 64, 4, 2) if args.small else (128, 128, 8, 4)
    rows: list[dict] = []
    torch.manual_seed(0)

    def record(row, call, check):
        try:
            y = call()
            row["check"] = bool(check(y))
            row.update(tfr.LAST_COMPILED)
            if cuda and row["check"]:
                row["ms"] = tfr.time_ms(call, cuda)
                row["time_x_cublas"] = row["ms"] / row["cublas_ms"]
                row["throughput_x_cublas"] = row["cublas_ms"] / row["ms"]
                row["tflops"] = 2 * row["M"] * row["N"] * row["K"] / row["ms"] / 1e9
        except Exception as e:  # a config that does not compile is a row, not a crash
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        print(json.dumps(row), flush=True)

    for name, N, K in shapes:
        for M in ms:
            x = torch.randn(M, K, device=dev).to(torch.bfloat16)
            w = (torch.randn(N, K, device=dev) / K**0.5).to(torch.bfloat16)
            ref = F.linear(x, w)
            cublas = tfr.time_ms(lambda x=x, w=w: F.linear(x, w), cuda) if cuda else float("nan")
            base = dict(shape=name, M=M, N=N, K=K, cublas_ms=cublas)
            for bm, bn, bk, warps, stages in plains:
                for persistent in (True, False):
                    row = dict(base, kernel="plain", persistent=persistent, tile=f"{bm}x{bn}x{bk}",
                               warps=warps, stages=stages)  # fmt: skip

                    def call(x=x, w=w, a=(bm, bn, bk, warps, stages, persistent)):
                        return plain_launch(x, w, *a)

                    record(row, call, lambda y, ref=ref: torch.allclose(y.float(), ref.float(),
                                                                rtol=2e-2, atol=2e-2))  # fmt: skip
            for runs in RUNS:
                kp = kp8 if runs == 8 else with_runs(kp8, runs)
                bm, bn, warps, stages = run_tile
                row = dict(base, kernel=f"runs={runs}", persistent=True, tile=f"{bm}x{bn}x64",
                           warps=warps, stages=stages)  # fmt: skip
                shipped = tm.triton_matmul(x, w, kp)

                def call(x=x, w=w, kp=kp, a=(bm, bn, warps, stages)):
                    return tfr.static_launch(x, w, kp, *a, 1)

                record(row, call, lambda y, s=shipped: torch.equal(y.view(torch.int16),
                                                                   s.view(torch.int16)))  # fmt: skip
    print(f"\n{'shape':18} {'M':>5} {'kernel':8} {'pers':>5} {'tile':>11} {'w':>2} {'st':>2} "
          f"{'check':>5} {'regs':>4} {'ms':>8} {'cuBLAS ms':>9} {'x time':>6} {'x thru':>6}")  # fmt: skip
    for r in rows:
        t, c = r.get("ms"), r.get("cublas_ms")
        print(f"{r['shape']:18} {r['M']:>5} {r['kernel']:8} {r['persistent']!s:>5} "
              f"{r['tile']:>11} {r['warps']:>2} {r['stages']:>2} "
              f"{str(r.get('check', r.get('error', '')))[:5]:>5} {r.get('regs', '')!s:>4} "
              f"{(f'{t:.4f}' if t else '-'):>8} {(f'{c:.4f}' if c == c else '-'):>9} "
              f"{(f'{t / c:.2f}' if t else '-'):>6} {(f'{c / t:.2f}' if t else '-'):>6}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"contract": tfr.CONTRACT, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
