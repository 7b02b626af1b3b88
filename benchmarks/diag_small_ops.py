"""The decode step's small ops on a GPU: does the one-kernel Triton RMSNorm give the PyTorch
reference's bits (``kernels.norm.reference_rms_norm``: ~20 launches a call), and what does each
cost at decode (32 rows) and trainer (16k rows) sizes. One table; ``--json`` for the rows.

    python benchmarks/diag_small_ops.py --json $OUT/small_ops.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch


def _rope_rows(kp) -> list[dict]:
    """The one-kernel RoPE against the reference: bits and time, decode and trainer sizes."""
    import triton.testing

    from contractgen.adapters.kernels.rope import reference_apply_rope, rope_cos_sin
    from contractgen.adapters.kernels.triton import rope as trope

    rows = []
    for (t, h, d), dtype in (
        (s, dt)
        for s in ((32, 16, 128), (32, 8, 128), (16384, 16, 128), (37, 5, 64))
        for dt in (torch.bfloat16, torch.float32)
    ):
        g = torch.Generator(device="cuda").manual_seed(t + h + d)
        x = (torch.randn(t, h, d, device="cuda", generator=g) * 3).to(dtype)
        pos = torch.randint(0, 40000, (t,), device="cuda", generator=g)
        cos, sin = rope_cos_sin(pos, d, 1e6, None, kp)
        got, want = trope.triton_apply_rope(x, cos, sin, kp), reference_apply_rope(x, cos, sin, kp)
        row = {
            "op": "rope", "shape": [t, h, d], "dtype": str(dtype),
            "mismatched": int((got.float() != want.float()).sum().item()),
        }  # fmt: skip
        if dtype == torch.bfloat16:
            row["triton_us"] = 1e3 * triton.testing.do_bench(
                lambda x=x, c=cos, s=sin: trope.triton_apply_rope(x, c, s, kp),
                return_mode="median",
            )
            row["reference_us"] = 1e3 * triton.testing.do_bench(
                lambda x=x, c=cos, s=sin: reference_apply_rope(x, c, s, kp), return_mode="median"
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _silu_rows(kp) -> list[dict]:
    """The one-kernel SiLU-GLU against the reference: bits and time."""
    import triton.testing

    from contractgen.adapters.kernels.mlp import reference_silu_glu
    from contractgen.adapters.kernels.triton import mlp as tmlp

    rows = []
    for (m, n), dtype in (
        (s, dt)
        for s in ((32, 3072), (16384, 3072), (37, 100))
        for dt in (torch.bfloat16, torch.float32)
    ):
        g = torch.Generator(device="cuda").manual_seed(m + n)
        gate = (torch.randn(m, n, device="cuda", generator=g) * 6).to(dtype)
        up = torch.randn(m, n, device="cuda", generator=g).to(dtype)
        got, want = tmlp.triton_silu_glu(gate, up, kp), reference_silu_glu(gate, up, kp)
        row = {
            "op": "silu_glu", "shape": [m, n], "dtype": str(dtype),
            "mismatched": int((got.float() != want.float()).sum().item()),
        }  # fmt: skip
        if dtype == torch.bfloat16:
            row["triton_us"] = 1e3 * triton.testing.do_bench(
                lambda a=gate, b=up: tmlp.triton_silu_glu(a, b, kp), return_mode="median"
            )
            row["reference_us"] = 1e3 * triton.testing.do_bench(
                lambda a=gate, b=up: reference_silu_glu(a, b, kp), return_mode="median"
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _chunk_sum_rows() -> list[dict]:
    """The one-pass log-softmax chunk sums against the reference: bits and time."""
    import triton.testing

    from contractgen.adapters.kernels.logsoftmax import reference_chunk_sums
    from contractgen.adapters.kernels.triton import logsoftmax as tls

    rows = []
    for t, v, block in ((32, 151936, 128), (4096, 151936, 128), (37, 1000, 64)):
        g = torch.Generator(device="cuda").manual_seed(t + v)
        x = torch.randn(t, v, device="cuda", generator=g) * 5
        m = x.amax(-1)
        got, want = tls.triton_chunk_sums(x, m, block), reference_chunk_sums(x, m, block)
        row = {
            "op": "logsoftmax_chunk_sums", "shape": [t, v], "block": block,
            "mismatched": int((got != want).sum().item()),
            "triton_us": 1e3 * triton.testing.do_bench(
                lambda x=x, m=m, b=block: tls.triton_chunk_sums(x, m, b), return_mode="median"
            ),
            "reference_us": 1e3 * triton.testing.do_bench(
                lambda x=x, m=m, b=block: reference_chunk_sums(x, m, b), return_mode="median"
            ),
        }  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contract", default="qwen3_dense_true_on_policy_v3")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import triton.testing

    from contractgen.adapters.kernels.norm import reference_rms_norm
    from contractgen.adapters.kernels.triton import norm as tnorm
    from contractgen.codegen.vendored import load_target

    kp0 = load_target("sglang").schema.kernel_policy_for(args.contract)
    rows = []
    shapes = [(32, 1024), (32 * 16, 128), (16384, 1024), (16384 * 16, 128), (32, 2560), (37, 100)]
    for (m, n), dtype, c, recip in (
        (s, d, c, r)
        for s in shapes
        for d in (torch.bfloat16, torch.float32)
        for c in (True, False)
        for r in (True, False)
    ):
        kp = dataclasses.replace(kp0, norm_cast_before_weight=c)
        g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
        x = (torch.randn(m, n, device="cuda", generator=g) * 3).to(dtype)
        w = (torch.rand(n, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
        tnorm.RECIPROCAL = recip
        got = tnorm.triton_rms_norm(x, w, 1e-6, kp)
        want = reference_rms_norm(x, w, 1e-6, kp)
        bad = (got.view(-1).float() != want.view(-1).float()).sum().item()
        row = {
            "rows": m, "n": n, "dtype": str(dtype), "cast_before_weight": c, "reciprocal": recip,
            "mismatched": int(bad), "max_abs": (got.float() - want.float()).abs().max().item(),
        }  # fmt: skip
        if dtype == torch.bfloat16 and c and recip:
            row["triton_us"] = 1e3 * triton.testing.do_bench(
                lambda x=x, w=w, kp=kp: tnorm.triton_rms_norm(x, w, 1e-6, kp),
                return_mode="median",
            )
            row["reference_us"] = 1e3 * triton.testing.do_bench(
                lambda x=x, w=w, kp=kp: reference_rms_norm(x, w, 1e-6, kp), return_mode="median"
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    rows += _rope_rows(kp0)
    rows += _silu_rows(kp0)
    rows += _chunk_sum_rows()
    print(f"\n{'rows':>7} {'n':>5} {'dtype':>15} {'cbw':>5} {'recip':>5} {'mismatch':>9} "
          f"{'triton us':>10} {'ref us':>10}")  # fmt: skip
    for r in rows:
        if "op" in r:
            print(f"{r['op']}: {r}")
            continue
        print(
            f"{r['rows']:>7} {r['n']:>5} {r['dtype']:>15} {r['cast_before_weight']!s:>5} "
            f"{r['reciprocal']!s:>5} {r['mismatched']:>9} {r.get('triton_us', 0):>10.1f} "
            f"{r.get('reference_us', 0):>10.1f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
