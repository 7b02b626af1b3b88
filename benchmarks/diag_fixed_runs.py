"""Which launches of the fused (v3, fixed_runs) Triton matmul agree bit for bit on a GPU.

For the tiny v3 model's shapes and a Qwen3-4B one: the persistent launch (TMA and pointer loads,
several tiles), the per-run launch (64- and 16-row tiles, 1 or 2 runs a program), at M = 4, 64
and 529 rows; each compared with the per-run launch at 64 rows, one run a program, row by row.

    python3 benchmarks/diag_fixed_runs.py
"""

from __future__ import annotations

import torch

from contractgen.adapters.kernels.matmul import fixed_run_width
from contractgen.adapters.kernels.triton import matmul as tmm
from contractgen.codegen.vendored import load_target

kp = load_target("sglang").schema.kernel_policy_for("qwen3_dense_true_on_policy_v3")
S = tmm.LaunchShape
PERSISTENT = {"p64_tma": S(64, 64, 4, 3, 2, True), "p64_ptr": S(64, 64, 4, 3, 2, False),
              "p64x128_tma": S(64, 128, 8, 3, 1, True)}  # fmt: skip
SMALL = {"s64_g1": S(64, 64, 4, 3), "s64_g2": S(64, 64, 4, 3, runs_per_program=2),
         "s16_g1": S(16, 64, 4, 3), "s16_g2": S(16, 64, 4, 3, runs_per_program=2)}  # fmt: skip


def launch(x, w, run, persistent=None, small=None, force_small=False):
    real = tmm._programs
    if force_small:
        tmm._programs = lambda device: 10_000
    elif persistent is not None:
        tmm._programs = lambda device: 1
    try:
        return tmm._launch(x, w, 64, run, torch.float32, persistent=persistent, small=small,
                           fused=True)  # fmt: skip
    finally:
        tmm._programs = real


for N, K in [(1536, 512), (512, 1536), (1000, 512), (4096, 2560)]:
    g = torch.Generator().manual_seed(N + K)
    w = torch.randn(N, K, generator=g).bfloat16().cuda()
    run = fixed_run_width(K, kp) // 64
    for M in (4, 64, 529):
        x = torch.randn(M, K, generator=g).bfloat16().cuda()
        ref = launch(x, w, run, small=SMALL["s64_g1"], force_small=True)
        out = {}
        for name, sh in PERSISTENT.items():
            out[name] = launch(x, w, run, persistent=sh)
        for name, sh in SMALL.items():
            out[name] = launch(x, w, run, small=sh, force_small=True)
        out["shipped"] = tmm._launch(x, w, 64, run, torch.float32, fused=True)
        row0 = tmm._launch(x[:1].contiguous(), w, 64, run, torch.float32, fused=True)
        same = {k: torch.equal(v, ref) for k, v in out.items()}
        print(
            f"N={N} K={K} M={M} run={run}: row0 alone == shipped row0:",
            torch.equal(row0[0], out["shipped"][0]),
            same,
            flush=True,
        )
