"""Launch-shape sweep of the Triton invariant matmul (H200), Qwen3-4B projection shapes.

Each candidate ``LaunchShape`` (output tile, warps, stages, programs per SM, runs per program)
first computes every case and is compared bit for bit with the shipped shape and with the
per-tile ``torch.mm`` mimic (what SGLang's kernel computes); a shape that changes a bit is
reported and never timed as a candidate (the tile dot would have become another instruction).
Then each case is timed against cuBLAS (``F.linear``). Large M runs the persistent launch, small
M the per-run launch (forced, even where the library takes the persistent one, as for gate/up at
M = 64; a K of one run has no per-run launch and takes the persistent one). Prints the fastest
shapes per launch and a table; ``--json`` writes every row.

    python3 benchmarks/tune_matmul.py --json $OUT/tune_matmul.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from bench_kernels import CONTRACT, SHAPES, Timer, _r, mimic_matmul

S = None  # the module's LaunchShape, bound in main()


def persistent_candidates():
    # (block_m, block_n, warps, stages, programs per SM, TMA loads). Shapes whose shared memory
    # (stages x (block_m + block_n) x k_block x 2 B) passed the H200's 227 KiB per SM were left out
    # after a first sweep (2026-12-02), as was issuing two K tiles' dots per iteration (slower
    # where it fit). TMA shapes: `tests/kernels/gpu_compile.py --resources` shows which fit two
    # or three programs per SM without spilling (64 x 128 and 128 x 64 at four warps spill at 16
    # runs, but not at 4 or 8).
    grid = [
        (64, 64, 4, 3, 2, False),
        (128, 128, 8, 3, 1, False),
        (64, 64, 4, 3, 2, True),
        (64, 64, 4, 2, 3, True),
        (64, 128, 4, 2, 2, True),
        (128, 64, 4, 2, 2, True),
        (64, 128, 8, 3, 1, True),
        (128, 64, 8, 3, 1, True),
        (128, 128, 8, 2, 1, True),
        (128, 128, 8, 3, 1, True),
        (64, 256, 8, 2, 1, True),
    ]
    return [S(bm, bn, w, st, pps, tma) for bm, bn, w, st, pps, tma in grid]


def ceiling_kernel():
    """A plain Triton GEMM, not the contract: TMA loads, one float32 accumulator carried across
    every K tile (so the compiler keeps one dot in flight while the next tile's loads land), no
    per-tile rounding. What Triton itself reaches on these shapes: the gap from it to cuBLAS is
    Triton's, the gap from the contract kernel to it is the contract's (a dot that starts from
    zero every 128 columns, then its rounding and the counter's adds)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _plain(x_desc, w_desc, y_ptr, M, N, K, sym, NUM_PROGS: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
        grid_n = tl.cdiv(N, BN)
        for tile in range(tl.program_id(0), tl.cdiv(M, BM) * grid_n, NUM_PROGS):
            pid_m = tile // grid_n
            pid_n = tile % grid_n
            acc = tl.zeros((BM, BN), tl.float32)
            for k0 in range(0, K, BK):
                a = x_desc.load([pid_m * BM, k0])
                b = w_desc.load([pid_n * BN, k0])
                acc = tl.dot(a, b.T, acc)
            offs_m = pid_m * BM + tl.arange(0, BM)
            offs_n = pid_n * BN + tl.arange(0, BN)
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            tl.store(
                y_ptr + offs_m[:, None] * sym + offs_n[None, :], acc.to(tl.bfloat16), mask=mask
            )

    def run(x, w, bm, bn, warps, stages, pps):
        from triton.tools.tensor_descriptor import TensorDescriptor

        M, K = x.shape
        N = w.shape[0]
        y = torch.empty(M, N, dtype=x.dtype, device=x.device)
        progs = min(torch.cuda.get_device_properties(x.device).multi_processor_count * pps,
                    triton.cdiv(M, bm) * triton.cdiv(N, bn))  # fmt: skip
        xd = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, 128])
        wd = TensorDescriptor(w, list(w.shape), list(w.stride()), [bn, 128])
        _plain[(progs,)](xd, wd, y, M, N, K, y.stride(0), progs, bm, bn, 128,
                         num_warps=warps, num_stages=stages)  # fmt: skip
        return y

    return run


CEILING_SHAPES = [(128, 128, 8, 3, 1), (128, 256, 8, 2, 1), (64, 64, 4, 3, 2)]


def small_candidates():
    grid = [
        (64, 128, 8, 3),
        (64, 128, 4, 3),
        (64, 64, 8, 3),
        (64, 64, 4, 3),
        (64, 32, 4, 3),
        (64, 32, 4, 4),
        (32, 32, 4, 4),
        (16, 128, 4, 3),
        (16, 64, 4, 3),
        (32, 64, 4, 3),
        (16, 32, 4, 4),
        (16, 32, 4, 6),
        (16, 16, 4, 4),
    ]
    # (block_m, block_n, warps, stages, runs per program): a program sums 2 or 4 adjacent runs
    grouped = [
        (64, 64, 8, 3, 2),
        (64, 64, 8, 3, 4),
        (64, 64, 4, 3, 2),
        (64, 128, 8, 3, 2),
        (64, 32, 4, 3, 2),
        (32, 64, 4, 3, 2),
        (16, 64, 4, 3, 2),
        (16, 32, 4, 4, 2),
        (16, 32, 4, 4, 4),
    ]
    return [S(bm, bn, w, st) for bm, bn, w, st in grid] + [
        S(bm, bn, w, st, runs_per_program=g) for bm, bn, w, st, g in grouped
    ]


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--large-ms", default="8192,4096", help="M of the persistent launch")
    ap.add_argument("--small-ms", default="1,16,64", help="M of the per-run launch")
    ap.add_argument("--shapes", help="name:N:K,... instead of the Qwen3-4B projections")
    ap.add_argument("--device", default="cuda", help="cpu runs Triton's interpreter (a smoke test)")
    ap.add_argument(
        "--cuda-graph",
        action="store_true",
        help="time both sides replayed from a CUDA graph (no host launch cost)",
    )
    ap.add_argument("--skip", choices=["persistent", "small"], help="leave one launch out")
    ap.add_argument(
        "--ceiling",
        action="store_true",
        help="also time a plain Triton GEMM (not the contract) at large M",
    )
    ap.add_argument("--contract", default=CONTRACT, help="whose kernel policy (default: v1)")
    ap.add_argument("--persistent-grid", help="bm:bn:warps:stages:pps:tma(0/1),... instead of ours")
    ap.add_argument("--small-grid", help="bm:bn:warps:stages:runs_per_program,... instead of ours")
    ap.add_argument("--json")
    return ap.parse_args()


def _ceiling_rows(x, w, case: tuple, cublas: float, time_ms) -> list[dict]:
    """A plain Triton GEMM (not the contract) timed at each of ``CEILING_SHAPES``."""
    name, M, N, K = case
    plain, rows = ceiling_kernel(), []
    for cs in CEILING_SHAPES:
        row = {"launch": "ceiling", "shape": name, "M": M, "N": N, "K": K, "tile": list(cs)}
        row["cublas_ms"] = cublas
        try:
            row["ms"] = time_ms(lambda x=x, w=w, cs=cs, f=plain: f(x, w, *cs))
            row["time_x_cublas"] = row["ms"] / cublas
        except Exception as e:  # out of shared memory: record, go on
            row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _print_summary(rows: list[dict]) -> None:
    """Each launch's candidate shapes by geometric-mean time x cuBLAS, then the ceiling."""
    keys = (
        "block_m",
        "block_n",
        "num_warps",
        "num_stages",
        "programs_per_sm",
        "tma",
        "runs_per_program",
    )
    for launch in ("persistent", "small"):
        mine = [r for r in rows if r["launch"] == launch]
        shapes = {tuple(r[k] for k in keys) for r in mine}
        summary = []
        for sh in shapes:
            rs = [r for r in mine if tuple(r[k] for k in keys) == sh]
            if all("time_x_cublas" in r for r in rs):
                geo = math.exp(sum(math.log(r["time_x_cublas"]) for r in rs) / len(rs))
                summary.append((geo, max(r["time_x_cublas"] for r in rs), sh))
            else:
                bad = [r for r in rs if "time_x_cublas" not in r]
                why = bad[0].get("error") or "bits differ from the shipped shape"
                print(f"{launch} {dict(zip(keys, sh, strict=True))}: not a candidate ({why})")
        print(f"\n{launch}: shapes by geometric-mean time x cuBLAS (worst case after it)")
        for geo, worst, sh in sorted(summary):
            print(f"  {geo:6.2f}  {worst:6.2f}  {dict(zip(keys, sh, strict=True))}")
    ceiling = [r for r in rows if r["launch"] == "ceiling"]
    if ceiling:
        print("\nceiling (plain Triton GEMM, not the contract): time x cuBLAS per case")
        for r in ceiling:
            got = f"{r['time_x_cublas']:6.2f}" if "time_x_cublas" in r else r["error"][:60]
            print(f"  {r['shape']:>10} M={r['M']:<5} tile {r['tile']}: {got}")


def main() -> None:
    global S
    args = _args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined

    from contractgen.adapters.kernels.triton import matmul as tmm
    from contractgen.codegen.vendored import load_target

    S = tmm.LaunchShape
    kp = load_target("sglang").schema.kernel_policy_for(args.contract)
    acc = getattr(torch, kp.matmul_accumulation_dtype)
    dev = args.device
    shapes = SHAPES
    if args.shapes:
        shapes = [(n, int(a), int(b)) for n, a, b in (s.split(":") for s in args.shapes.split(","))]
    tm = Timer(dev)
    time_ms = tm.graph_ms if args.cuda_graph and dev == "cuda" else tm.ms
    rows = []

    def grid(text, make):
        return [make(*map(int, c.split(":"))) for c in text.split(",")]

    persistent = (
        grid(args.persistent_grid, lambda bm, bn, w, st, pps, tma: S(bm, bn, w, st, pps, bool(tma)))
        if args.persistent_grid
        else persistent_candidates()
    )
    small = (
        grid(args.small_grid, lambda bm, bn, w, st, g: S(bm, bn, w, st, runs_per_program=g))
        if args.small_grid
        else small_candidates()
    )
    for launch, ms, cands in (
        ("persistent", [int(m) for m in args.large_ms.split(",")], persistent),
        ("small", [int(m) for m in args.small_ms.split(",")], small),
    ):
        if launch == args.skip:
            continue
        for name, N, K in shapes:
            w = _r(N, K, device=dev, seed=1, scale=K**-0.5)
            run, fused = tmm._tiles_per_run(K, kp, kp.matmul_tile_order)
            for M in ms:
                x = _r(M, K, device=dev, seed=2)
                shipped = tmm._launch(x, w, kp.matmul_k_block, run, acc, fused=fused).to(x.dtype)
                mimic_ok = (
                    dev == "cuda" and not fused and torch.equal(shipped, mimic_matmul(x, w, kp))
                )
                cublas = time_ms(lambda x=x, w=w: F.linear(x, w))
                if launch == "persistent" and args.ceiling and dev == "cuda":
                    rows += _ceiling_rows(x, w, (name, M, N, K), cublas, time_ms)
                for shape in cands:
                    kw = {launch: shape}

                    def call(x=x, w=w, run=run, kw=kw, small=launch == "small", fused=fused):
                        if not small:
                            return tmm._launch(x, w, kp.matmul_k_block, run, acc, fused=fused, **kw)
                        real = tmm._programs  # more SMs than tiles: the per-run launch
                        tmm._programs = lambda device: 10_000
                        try:
                            return tmm._launch(x, w, kp.matmul_k_block, run, acc, fused=fused, **kw)
                        finally:
                            tmm._programs = real

                    row = {"launch": launch, "shape": name, "M": M, "N": N, "K": K}
                    row |= {**shape.__dict__, "cublas_ms": cublas, "shipped_equals_mimic": mimic_ok}
                    try:
                        row["bits_equal_shipped"] = torch.equal(call().to(x.dtype), shipped)
                        if row["bits_equal_shipped"]:
                            row["ms"] = time_ms(call)
                            row["time_x_cublas"] = row["ms"] / cublas
                    except Exception as e:  # out of shared memory / registers: record, go on
                        row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
                    rows.append(row)
                    print(json.dumps(row), flush=True)

    _print_summary(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
