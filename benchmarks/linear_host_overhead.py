"""Where a small-M invariant linear's time goes: GPU or host (H200).

At M = 1-64 the kernel's GPU time is a few microseconds, so a timing of the public entry point
(``triton_matmul``: autograd function, reshapes, the launch) can be the host's time, not the
GPU's. For one projection shape and a few M this prints, per layer of the call stack, the
``do_bench`` median (CUDA events; the GPU idles while the host is slower than it) and the host's
own time per call (``perf_counter`` over back-to-back calls, one synchronize at the end), next
to cuBLAS.

    python3 benchmarks/linear_host_overhead.py --json $OUT/linear_host_overhead.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from bench_kernels import CONTRACT, Timer, _r


def host_us(fn, n=200):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shape", default="1024,2560", help="N,K (default: Qwen3-4B k_proj)")
    ap.add_argument("--ms", default="1,16,64,4096")
    ap.add_argument("--json")
    args = ap.parse_args()

    from contractgen.adapters.kernels.matmul import _run_length
    from contractgen.adapters.kernels.triton import matmul as tmm
    from contractgen.codegen.vendored import load_target

    kp = load_target("sglang").schema.kernel_policy_for(CONTRACT)
    acc = getattr(torch, kp.matmul_accumulation_dtype)
    N, K = (int(v) for v in args.shape.split(","))
    tm = Timer("cuda")
    w = _r(N, K, device="cuda", seed=1, scale=K**-0.5)
    run = _run_length(kp.matmul_tile_order, math.ceil(K / kp.matmul_k_block))
    rows = []
    for M in (int(m) for m in args.ms.split(",")):
        x = _r(M, K, device="cuda", seed=2)
        calls = {
            "cublas F.linear": lambda x=x: F.linear(x, w),
            "_launch (kernel only)": lambda x=x: tmm._launch(x, w, kp.matmul_k_block, run, acc),
            "_Matmul.apply": lambda x=x: tmm._Matmul.apply(x, w, kp.matmul_k_block, run, acc),
            "triton_matmul": lambda x=x: tmm.triton_matmul(x, w, kp),
        }
        for name, fn in calls.items():
            row = {"M": M, "N": N, "K": K, "call": name, "do_bench_us": tm.ms(fn) * 1e3}
            row["host_us"] = host_us(fn)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'M':>5}  {'call':<24}{'do_bench us':>12}{'host us/call':>14}")
    for r in rows:
        print(f"{r['M']:>5}  {r['call']:<24}{r['do_bench_us']:>12.1f}{r['host_us']:>14.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
