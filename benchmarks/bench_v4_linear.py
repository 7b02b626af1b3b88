"""The shipped v3 and v4 linears against cuBLAS on the Qwen3-4B projections, side by side in one
process, each called as the layers call it: a column-parallel projection (q, k/v, gate/up) with
the contract's policy, a row-parallel one (o, down) with ``shard_policy(kp, 1)``.

v4 (``qwen3_dense_true_on_policy_v4``) differs from v3 only in the column calls: one float32 dot
over all of K (``matmul_column_k_runs: 1``), which the kernel runs at a 128 x 256 tile; its row
calls are v3's. Before anything is timed, each v4 call is checked bitwise for batch invariance
on this GPU: the rows of the M = 4096 call (wide tile), of M = 64 and of M = 1 (narrow tile)
must be the same bits, and the v4 row calls must equal v3's.

M <= 64 is timed under a CUDA graph (as the rollout's decode runs), larger M eagerly. Prints
one table, time as a multiple of cuBLAS time; ``--json`` writes every row.

    python3 benchmarks/bench_v4_linear.py --json $OUT/v4_linear.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from contractgen.adapters.kernels.matmul import shard_policy
from contractgen.adapters.kernels.policy import KernelPolicy, kernel_policy
from contractgen.adapters.kernels.triton import matmul as tm
from contractgen.codegen.vendored import load_target

SHAPES = [  # Qwen3-4B projections (name, N, K, parallel)
    ("q_proj", 4096, 2560, "column"),
    ("k_proj/v_proj", 1024, 2560, "column"),
    ("gate_proj/up_proj", 9728, 2560, "column"),
    ("o_proj", 2560, 4096, "row"),
    ("down_proj", 2560, 9728, "row"),
]
MS = [1, 16, 64, 4096, 8192]


def policies() -> dict[str, KernelPolicy]:
    schema = load_target("sglang").schema
    return {
        v: kernel_policy(schema.kernel_policy_for(f"qwen3_dense_true_on_policy_{v}"))
        for v in ("v3", "v4")
    }


def call_policy(kp: KernelPolicy, parallel: str) -> KernelPolicy:
    return shard_policy(kp, 1) if parallel == "row" else kp


def time_ms(fn, graph: bool) -> float:
    from triton.testing import do_bench

    if not graph:
        return do_bench(fn, warmup=10, rep=60, return_mode="median")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, warmup=10, rep=60, return_mode="median")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--graph-all", action="store_true",
                    help="time every M under a CUDA graph (default: M <= 64 only), so a slow "
                    "host's launch cost does not floor the large-M times")  # fmt: skip
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_v4_linear.py times CUDA kernels: run it on a GPU")
    kps = policies()
    torch.manual_seed(0)
    rows, checks = [], []
    for name, N, K, parallel in SHAPES:
        x_all = torch.randn(max(MS), K, device="cuda").to(torch.bfloat16)
        w = (torch.randn(N, K, device="cuda") / K**0.5).to(torch.bfloat16)
        kp3, kp4 = (call_policy(kps[v], parallel) for v in ("v3", "v4"))
        big = tm.triton_matmul(x_all[:4096], w, kp4)
        mid = tm.triton_matmul(x_all[:64], w, kp4)
        one = tm.triton_matmul(x_all[:1], w, kp4)
        check = dict(
            shape=name,
            parallel=parallel,
            rows_4096_vs_64=bool(torch.equal(bits(big[:64]), bits(mid))),
            rows_64_vs_1=bool(torch.equal(bits(mid[:1]), bits(one))),
            v4_equals_v3=bool(torch.equal(bits(big), bits(tm.triton_matmul(x_all[:4096], w, kp3)))),
            launch_4096=str(tm.persistent_shape(x_all[:4096], w, 1 if parallel == "column" else 8, True)),
        )  # fmt: skip
        checks.append(check)
        print(json.dumps(check), flush=True)
        for M in MS:
            x = x_all[:M]
            graph = args.graph_all or M <= 64
            row = dict(shape=name, parallel=parallel, M=M, N=N, K=K, graph=graph)
            row["cublas_ms"] = time_ms(lambda x=x, w=w: F.linear(x, w), graph)
            for v, kp in (("v3", kp3), ("v4", kp4)):
                row[f"{v}_ms"] = time_ms(lambda x=x, w=w, kp=kp: tm.triton_matmul(x, w, kp), graph)
                row[f"{v}_x_cublas"] = row[f"{v}_ms"] / row["cublas_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'shape':18} {'par':6} {'M':>5} {'graph':>5} {'cuBLAS ms':>9} {'v3 ms':>8} "
          f"{'v3 x':>5} {'v4 ms':>8} {'v4 x':>5}")  # fmt: skip
    for r in rows:
        print(f"{r['shape']:18} {r['parallel']:6} {r['M']:>5} {r['graph']!s:>5} "
              f"{r['cublas_ms']:>9.4f} {r['v3_ms']:>8.4f} {r['v3_x_cublas']:>5.2f} "
              f"{r['v4_ms']:>8.4f} {r['v4_x_cublas']:>5.2f}")  # fmt: skip
    print("\nbitwise checks (v4):")
    for c in checks:
        print(f"  {c['shape']:18} {c['parallel']:6} rows M=4096 vs 64: {c['rows_4096_vs_64']}, "
              f"M=64 vs 1: {c['rows_64_vs_1']}, equals v3: {c['v4_equals_v3']}, "
              f"launch at 4096: {c['launch_4096']}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"checks": checks, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
