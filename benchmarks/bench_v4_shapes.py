"""Two questions bench_v4_linear.py left open, on the Qwen3-4B projections, against cuBLAS in one
process (time as a multiple of cuBLAS time on the same operands):

1. **Row-parallel linears at the TP they are sharded for.** o_proj and down_proj keep v3's 8 K
   runs and float32 tree because their K is split over TP ranks. A rank of TP = t runs K / t with
   8 / t runs (``shard_policy(kp, t)``); at t = 8 that is one run, the column calls' fast path.
   Timed per rank, against cuBLAS on the same shard.
2. **Launch tiles for one-run column calls at M <= 64.** One run leaves no K split to spread
   over the SMs; narrower output tiles give more programs. Each candidate is first checked
   bitwise against the rows of the M = 4096 call (the 128 x 256 tile); a candidate whose bits
   differ is reported and not timed.

M <= 64 is timed under a CUDA graph, larger M eagerly. ``--json`` writes every row.

    python3 benchmarks/bench_v4_shapes.py --json $OUT/v4_shapes.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from bench_v4_linear import bits, policies, time_ms

from contractgen.adapters.kernels.matmul import shard_policy
from contractgen.adapters.kernels.triton import matmul as tm

ROW_SHAPES = [("o_proj", 2560, 4096), ("down_proj", 2560, 9728)]
COLUMN_SHAPES = [("q_proj", 4096, 2560), ("k_proj/v_proj", 1024, 2560), ("gate_proj/up_proj", 9728, 2560)]  # fmt: skip
SMALL_TILES = [  # (block_m, block_n, warps, programs per SM); the first is the shipped one
    (64, 64, 4, 2),
    (64, 32, 4, 2),
    (64, 16, 4, 4),
    (16, 64, 4, 2),
    (16, 32, 4, 4),
    (16, 16, 2, 4),
]


def row_shards(kp4, rows: list) -> None:
    for name, N, K in ROW_SHAPES:
        for tp in (1, 2, 4, 8):
            kp = shard_policy(kp4, tp)
            w = (torch.randn(N, K // tp, device="cuda") / K**0.5).to(torch.bfloat16)
            for M in (1, 64, 4096, 8192):
                x = torch.randn(M, K // tp, device="cuda").to(torch.bfloat16)
                graph = M <= 64
                row = dict(part="row_shard", shape=name, tp=tp, runs=kp.matmul_k_runs, M=M, N=N,
                           K=K // tp, graph=graph)  # fmt: skip
                row["launch"] = str(tm.persistent_shape(x, w, kp.matmul_k_runs, True))
                row["cublas_ms"] = time_ms(lambda x=x, w=w: F.linear(x, w), graph)
                row["v4_ms"] = time_ms(lambda x=x, w=w, kp=kp: tm.triton_matmul(x, w, kp), graph)
                row["x_cublas"] = row["v4_ms"] / row["cublas_ms"]
                rows.append(row)
                print(json.dumps(row), flush=True)


def small_tiles(kp4, rows: list) -> None:
    k_block = kp4.matmul_k_block
    for name, N, K in COLUMN_SHAPES:
        x_all = torch.randn(4096, K, device="cuda").to(torch.bfloat16)
        w = (torch.randn(N, K, device="cuda") / K**0.5).to(torch.bfloat16)
        big = tm.triton_matmul(x_all, w, kp4)
        run = K // k_block
        for M in (1, 16, 64):
            x = x_all[:M]
            row = dict(part="small_tiles", shape=name, M=M, N=N, K=K)
            row["cublas_ms"] = time_ms(lambda x=x, w=w: F.linear(x, w), True)
            for bm, bn, warps, pps in SMALL_TILES:
                shape = tm.LaunchShape(block_m=bm, block_n=bn, num_warps=warps, num_stages=4,
                                       programs_per_sm=pps, tma=True)  # fmt: skip
                key = f"{bm}x{bn}w{warps}p{pps}"

                def call(x=x, shape=shape, w=w, run=run):
                    return tm._launch(x, w, k_block, run, torch.float32, persistent=shape,
                                      fused=True, out=torch.bfloat16)  # fmt: skip

                same = bool(torch.equal(bits(call()), bits(big[:M])))
                row[f"{key}_same_bits"] = same
                if same:
                    row[f"{key}_x_cublas"] = time_ms(call, True) / row["cublas_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--parts", default="row_shards,small_tiles")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_v4_shapes.py times CUDA kernels: run it on a GPU")
    kp4 = policies()["v4"]
    torch.manual_seed(0)
    rows: list = []
    parts = args.parts.split(",")
    if "row_shards" in parts:
        row_shards(kp4, rows)
    if "small_tiles" in parts:
        small_tiles(kp4, rows)
    print(f"\n{'shape':18} {'TP':>3} {'runs':>4} {'M':>5} {'launch':>44} {'x cuBLAS':>8}")
    for r in rows:
        if r["part"] == "row_shard":
            print(f"{r['shape']:18} {r['tp']:>3} {r['runs']:>4} {r['M']:>5} "
                  f"{r['launch'][:44]:>44} {r['x_cublas']:>8.2f}")  # fmt: skip
    keys = [f"{bm}x{bn}w{w}p{p}" for bm, bn, w, p in SMALL_TILES]
    print(f"\n{'shape':18} {'M':>3} " + " ".join(f"{k:>12}" for k in keys))
    for r in rows:
        if r["part"] == "small_tiles":
            cells = [f"{r[k + '_x_cublas']:.2f}" if r[k + "_same_bits"] else "BITS" for k in keys]
            print(f"{r['shape']:18} {r['M']:>3} " + " ".join(f"{c:>12}" for c in cells))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
