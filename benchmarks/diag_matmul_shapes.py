"""Which launch shapes of the Triton invariant matmul give the shipped bits, per route (H200).

``test_triton_matmul_launch_shape_keeps_bits[640]`` failed on the H200 when per-run-only shapes
were also passed to the persistent launch (2026-12-02). For K = 640 (one run of 5 tiles), 1024
(4 runs of 2) and 2560 (4 runs of 5), 70 rows x 200 columns, each shape is run three ways: the
library's route with that shape, forced onto the persistent launch, and forced onto the per-run
launch. Prints one line per (K, shape): whether each equals the shipped result, and how many
outputs differ.

    python3 benchmarks/diag_matmul_shapes.py
"""

from __future__ import annotations

import torch

from contractgen.adapters.kernels.triton import matmul as tmm
from contractgen.codegen.vendored import load_target

S = tmm.LaunchShape
SHAPES = [
    S(64, 64, 4, 2),
    S(128, 64, 8, 3, 2),
    S(64, 64, 4, 3, 2, True),
    S(128, 64, 8, 2, tma=True),
    S(64, 64, 8, 3),
    S(64, 64, 8, 3, runs_per_program=2),
    S(16, 32, 4, 4),
    S(16, 32, 4, 4, runs_per_program=4),
    S(16, 64, 4, 3),
    S(32, 32, 4, 4),
    S(32, 64, 4, 3),
    tmm.PERSISTENT_LARGE,
]


def _r(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16).cuda()


def _with_programs(n, fn):
    """``fn()`` with the SM count read as ``n`` (1: every call persistent; 10,000: per-run)."""
    real = tmm._programs
    tmm._programs = lambda device: n
    try:
        return fn()
    finally:
        tmm._programs = real


def main() -> None:
    kp = load_target("sglang").schema.kernel_policy_for("qwen3_dense_true_on_policy_v1")
    for k in (640, 1024, 2560):
        x, w = _r(70, k), _r(200, k, seed=1)
        run = tmm._run_length(kp.matmul_tile_order, k // kp.matmul_k_block)
        full = tmm.triton_matmul(x, w, kp)
        for sh in SHAPES:
            args = (x, w, kp.matmul_k_block, run, torch.bfloat16)
            routed = tmm._launch(*args, persistent=sh, small=sh)
            persistent = _with_programs(1, lambda: tmm._launch(*args, persistent=sh, small=sh))  # noqa: B023
            per_run = _with_programs(10_000, lambda: tmm._launch(*args, small=sh))  # noqa: B023
            print(k, run, sh.block_m, sh.block_n, sh.num_warps, sh.num_stages, sh.tma,
                  sh.runs_per_program, "default-route", torch.equal(routed, full),
                  "persistent", torch.equal(persistent, full), int((persistent != full).sum()),
                  "per-run", torch.equal(per_run, full), int((per_run != full).sum()),
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
