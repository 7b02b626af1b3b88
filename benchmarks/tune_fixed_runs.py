"""fixed_runs (v3) at large M: kernel structures for the persistent launch, each checked bit for
bit against the shipped ``triton_matmul`` before it is timed against cuBLAS (H200).

The shipped fused persistent kernel walks all K tiles of an output tile in one loop and pushes
a finished run into the float32 counter under a runtime ``if``: the counter's levels are loop
carried and selected every iteration, and the tile is 64 x 64 (3.0-3.8x cuBLAS time on Qwen3-4B
projections, BENCHMARKS.md). Candidates here:

* ``static``: the runs unrolled at compile time (``tl.static_range``), each run's tiles one
  pipelined inner loop accumulating in the dot's float32 accumulator, the push into the counter
  resolved at compile time (no runtime branch, no selects; the counter's levels are live only
  between the runs that fill them). The output is rounded in the epilogue (stored in the
  output dtype: no float32 ``[M, N]`` round trip through memory).
* ``static_f32out``: the same, storing float32 and rounding in torch afterwards (what the
  shipped path does), to separate the two changes.

Each row: structure, tile, warps, stages, bits equal to the shipped kernel (must be True to be
timed), time, cuBLAS time, ratio. ``--json`` writes every row.

    python3 benchmarks/tune_fixed_runs.py --json $OUT/tune_fixed_runs.json
    TRITON_INTERPRET=1 python3 benchmarks/tune_fixed_runs.py --small   # CPU: bits only
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from contractgen.adapters.kernels.triton import matmul as tm
from contractgen.codegen.vendored import load_target

CONTRACT = "qwen3_dense_true_on_policy_v3"
SHAPES = [  # Qwen3-4B projections (name, N, K)
    ("q_proj", 4096, 2560),
    ("k_proj/v_proj", 1024, 2560),
    ("o_proj", 2560, 4096),
    ("gate_proj/up_proj", 9728, 2560),
    ("down_proj", 2560, 9728),
]
SMALL_SHAPES = [("q_small", 128, 512), ("down_small", 64, 1024)]


@triton.jit
def _static_tile(
    x_desc, w_desc, off_m, off_n, RUN: tl.constexpr, NUM_RUNS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
    WS: tl.constexpr,
):  # fmt: skip
    s0 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    s1 = s0
    s2 = s0
    s3 = s0
    s4 = s0
    s5 = s0
    s6 = s0
    for r in tl.static_range(NUM_RUNS):
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for j in tl.range(RUN, num_stages=STAGES, warp_specialize=WS):
            k0 = (r * RUN + j) * BLOCK_K
            a = x_desc.load([off_m, k0])
            b = w_desc.load([off_n, k0])
            if tm.INTERPRET:
                acc = acc + tm.interpreter_dot(a, tl.trans(b))
            else:
                acc = tl.dot(a, b.T, acc)
        s0, s1, s2, s3, s4, s5, s6 = tm._push(
            acc, r + 1, s0, s1, s2, s3, s4, s5, s6, NUM_RUNS, tl.float32
        )  # fmt: skip
    return tm._total(s0, s1, s2, s3, s4, s5, s6, NUM_RUNS)


@triton.jit
def _static_persistent(
    x_desc, w_desc, y_ptr, M, N, sym, RUN: tl.constexpr, NUM_RUNS: tl.constexpr,
    NUM_PROGS: tl.constexpr, ITERS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr, OUT: tl.constexpr,
    WS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    for i in range(ITERS):
        tile = pid + i * NUM_PROGS
        if tile < grid_m * grid_n:
            pid_m, pid_n = tm._tile_coords(tile, grid_m, grid_n, GROUP_M)
            y = _static_tile(
                x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, RUN, NUM_RUNS, BLOCK_M,
                BLOCK_N, BLOCK_K, STAGES, WS,
            )  # fmt: skip
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * sym + offs_n[None, :]
            tl.store(ptrs, tm._round(y, OUT), mask=mask)


@triton.jit
def _push_scratch(c, n, lv_ptrs, level_stride, LOG: tl.constexpr):
    """Finished run ``n`` (1-based, a runtime value) into a binary counter whose levels live in
    a per-program float32 scratch (``lv_ptrs`` + ``l * level_stride``): from level 0 up, a level
    whose bit of ``n`` is 0 is added on the left (``level + c``, as ``_push``) and the carry goes
    up; the first level whose bit is 1 stores the carry. After the last run (``n == 2**LOG``)
    the whole sum is stored at level ``LOG``. Each thread stores and loads the same elements
    (one pointer tensor), so its own program order orders them."""
    done = n < 0  # False, as a runtime scalar the branches can carry
    for lvl in tl.static_range(LOG + 1):
        if not done:
            if lvl == LOG or ((n >> lvl) & 1) == 1:
                tl.store(lv_ptrs + lvl * level_stride, c)
                done = n >= 0
            else:
                c = tm._ieee_add(tl.load(lv_ptrs + lvl * level_stride), c)
    return c


@triton.jit
def _flat_persistent(
    x_desc, w_desc, y_ptr, lv_ptr, M, N, sym, RUN: tl.constexpr, NUM_RUNS: tl.constexpr,
    LOG: tl.constexpr, NUM_PROGS: tl.constexpr, ITERS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr,
    OUT: tl.constexpr,
):  # fmt: skip
    """One pipelined loop over every K tile of the output tile (the next run's loads are issued
    while this run's last dots finish); a finished run goes into the counter, whose levels live
    in scratch, so the dot's accumulator is the loop's only carried tile."""
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    lv_ptrs = lv_ptr + pid.to(tl.int64) * ((LOG + 1) * BLOCK_M * BLOCK_N) + rows[:, None] * BLOCK_N
    lv_ptrs = lv_ptrs + cols[None, :]
    for i in range(ITERS):
        tile = pid + i * NUM_PROGS
        if tile < grid_m * grid_n:
            pid_m, pid_n = tm._tile_coords(tile, grid_m, grid_n, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for t in tl.range(0, RUN * NUM_RUNS, num_stages=STAGES):
                a = x_desc.load([off_m, t * BLOCK_K])
                b = w_desc.load([off_n, t * BLOCK_K])
                if tm.INTERPRET:
                    acc = acc + tm.interpreter_dot(a, tl.trans(b))
                else:
                    acc = tl.dot(a, b.T, acc)
                if t % RUN == RUN - 1:
                    _push_scratch(acc, t // RUN + 1, lv_ptrs, BLOCK_M * BLOCK_N, LOG)
                    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            y = tl.load(lv_ptrs + LOG * BLOCK_M * BLOCK_N)
            offs_m = off_m + rows
            offs_n = off_n + cols
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * sym + offs_n[None, :]
            tl.store(ptrs, tm._round(y, OUT), mask=mask)


def flat_launch(x, w, kp, bm, bn, warps, stages, pps):
    M, K = x.shape
    N = w.shape[0]
    bk = kp.matmul_k_block
    run, _ = tm._tiles_per_run(K, kp, kp.matmul_tile_order)
    runs = (K // bk) // run
    log = runs.bit_length() - 1
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    progs = min(tm._programs(x.device) * pps, tiles)
    iters = triton.next_power_of_2(triton.cdiv(tiles, progs))
    lv = torch.empty(progs * (log + 1) * bm * bn, dtype=torch.float32, device=x.device)
    xd = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, bk])
    wd = TensorDescriptor(w, list(w.shape), list(w.stride()), [bn, bk])
    k = _flat_persistent[(progs,)](
        xd, wd, y, lv, M, N, y.stride(0), run, runs, log, progs, iters, bm, bn, bk, tm.GROUP_M,
        stages, tm._TL[x.dtype], num_warps=warps, num_stages=stages,
    )  # fmt: skip
    LAST_COMPILED["regs"] = getattr(k, "n_regs", None)
    LAST_COMPILED["spills"] = getattr(k, "n_spills", None)
    return y


def static_launch(x, w, kp, bm, bn, warps, stages, pps, f32_out=False, ws=False):
    M, K = x.shape
    N = w.shape[0]
    bk = kp.matmul_k_block
    run, fused = tm._tiles_per_run(K, kp, kp.matmul_tile_order)
    assert fused
    runs = (K // bk) // run
    out = torch.float32 if f32_out else x.dtype
    y = torch.empty(M, N, dtype=out, device=x.device)
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    progs = min(tm._programs(x.device) * pps, tiles)
    iters = triton.next_power_of_2(triton.cdiv(tiles, progs))
    xd = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, bk])
    wd = TensorDescriptor(w, list(w.shape), list(w.stride()), [bn, bk])
    k = _static_persistent[(progs,)](
        xd, wd, y, M, N, y.stride(0), run, runs, progs, iters, bm, bn, bk, tm.GROUP_M, stages,
        tm._TL[out], ws, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    LAST_COMPILED["regs"] = getattr(k, "n_regs", None)
    LAST_COMPILED["spills"] = getattr(k, "n_spills", None)
    return y.to(x.dtype)


LAST_COMPILED: dict = {}


CANDIDATES = [  # (structure, block_m, block_n, warps, stages, programs per SM)
    ("static", 128, 128, 8, 4, 1),
    ("static", 128, 128, 8, 5, 1),
    ("flat", 128, 128, 8, 4, 1),
    ("flat", 128, 128, 8, 5, 1),
    ("flat", 128, 128, 8, 3, 1),
    ("flat", 128, 256, 8, 3, 1),
    ("flat", 128, 64, 4, 4, 2),
    ("flat", 64, 128, 4, 4, 2),
    ("flat", 64, 64, 4, 4, 2),
]
SMALL_CANDIDATES = [
    ("static", 64, 64, 4, 2, 1),
    ("static", 32, 64, 4, 2, 1),
    ("flat", 64, 64, 4, 2, 1),
    ("flat", 32, 64, 4, 2, 2),
]


def time_ms(fn, cuda: bool) -> float:
    if cuda:
        from triton.testing import do_bench

        return do_bench(fn, warmup=10, rep=60, return_mode="median")
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="small shapes (CPU interpreter)")
    ap.add_argument("--ms", default="4096,8192", help="row counts M")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    kp = load_target("sglang").schema.kernel_policy_for(CONTRACT)
    cuda = torch.cuda.is_available() and not tm.INTERPRET
    dev = "cuda" if cuda else "cpu"
    shapes = SMALL_SHAPES if args.small else SHAPES
    ms = [64, 128] if args.small else [int(m) for m in args.ms.split(",")]
    cands = SMALL_CANDIDATES if args.small else CANDIDATES
    rows = []
    torch.manual_seed(0)
    for name, N, K in shapes:
        for M in ms:
            x = torch.randn(M, K, device=dev).to(torch.bfloat16)
            w = (torch.randn(N, K, device=dev) / K**0.5).to(torch.bfloat16)
            shipped = tm.triton_matmul(x, w, kp)
            ref = (x.double() @ w.double().T).float()
            cublas = time_ms(lambda x=x, w=w: F.linear(x, w), cuda) if cuda else float("nan")
            base = time_ms(lambda x=x, w=w: tm.triton_matmul(x, w, kp), cuda) if cuda else None
            rows.append(dict(shape=name, M=M, N=N, K=K, structure="shipped", ms=base,
                             cublas_ms=cublas, bits_equal_shipped=True,
                             time_x_cublas=(base / cublas) if cuda else None))  # fmt: skip
            for struct, bm, bn, warps, stages, pps in cands:
                row = dict(shape=name, M=M, N=N, K=K, structure=struct, block_m=bm,
                           block_n=bn, num_warps=warps, num_stages=stages, programs_per_sm=pps)  # fmt: skip

                f32_out = struct.endswith("f32out")
                ws = struct.endswith("_ws")

                def call(x=x, w=w, bm=bm, bn=bn, warps=warps, stages=stages, pps=pps,
                         f32=f32_out, ws=ws, flat=struct == "flat"):  # fmt: skip
                    if flat:
                        return flat_launch(x, w, kp, bm, bn, warps, stages, pps)
                    return static_launch(x, w, kp, bm, bn, warps, stages, pps, f32, ws)

                try:
                    y = call()
                    row["bits_equal_shipped"] = bool(
                        torch.equal(y.view(torch.int16), shipped.view(torch.int16))
                    )
                    row["rel_err"] = float((y.float() - ref).norm() / ref.norm())
                    row.update(LAST_COMPILED)
                    if cuda and row["bits_equal_shipped"]:
                        row["ms"] = time_ms(call, cuda)
                        row["cublas_ms"] = cublas
                        row["time_x_cublas"] = row["ms"] / cublas
                except Exception as e:  # a shape that does not compile is a row, not a crash
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{'shape':18} {'M':>5} {'structure':14} {'tile':>9} {'w':>2} {'st':>2} "
          f"{'bits':>5} {'regs':>4} {'spill':>5} {'ms':>8} {'x cuBLAS':>8}")  # fmt: skip
    for r in rows:
        tile = f"{r.get('block_m', '')}x{r.get('block_n', '')}" if "block_m" in r else "-"
        t = r.get("ms")
        x = r.get("time_x_cublas")
        print(f"{r['shape']:18} {r['M']:>5} {r['structure']:14} {tile:>9} "
              f"{r.get('num_warps', ''):>2} {r.get('num_stages', ''):>2} "
              f"{str(r.get('bits_equal_shipped', r.get('error', '')))[:5]:>5} "
              f"{r.get('regs', '')!s:>4} {r.get('spills', '')!s:>5} "
              f"{(f'{t:.4f}' if t else '-'):>8} {(f'{x:.2f}' if x else '-'):>8}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"contract": CONTRACT, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
