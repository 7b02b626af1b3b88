"""Launch-shape sweep of the Triton attention kernels on a packed training batch (H200).

For the forward (``triton_attention_lse``: query rows per program, warps, stages) it reports the
time and whether the output bits equal the shipped shape's: a forward shape is a contract-side
choice (the rollout and the trainer must run the same one), so a faster shape that changes bits is
only adopted together with a re-run of the exactness gate. For the backward (no forward bit
depends on it) it reports the time of the whole backward at the shipped shapes, then with one
kernel's shape varied and the other's shipped (``DKDV``, ``DQ``); each row says whether two runs
gave the same bits. Prints tables; ``--json`` writes every row.

    python3 benchmarks/tune_attention.py --json $OUT/tune_attention.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import torch
from kernel_time import flush_l2, kernel_ms

_FLUSH = []  # [True] under --flush-l2
_KERNEL_TIME = []  # [True] under --kernel-time


def _ms(fn, reps=20):
    if os.environ.get("TRITON_INTERPRET") == "1":  # a CPU smoke run (the interpreter): wall time
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    fn()
    torch.cuda.synchronize()
    if _KERNEL_TIME:
        return kernel_ms(fn, reps, flush=bool(_FLUSH))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        if _FLUSH:
            flush_l2()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--heads", default="16,8,128", help="query heads, KV heads, head dim")
    ap.add_argument("--forward-only", action="store_true", help="skip the backward sweep")
    ap.add_argument("--decode", type=int, metavar="CTX",
                    help="sweep decode instead: --batch requests, one query each at CTX keys")  # fmt: skip
    ap.add_argument("--device", default="cuda", help="cpu runs Triton's interpreter (a smoke test)")
    ap.add_argument("--block-qs", default="32,64,128", help="forward: query rows per tile to try")
    ap.add_argument("--stages", default="1,2,3", help="forward: pipeline stages to try")
    ap.add_argument("--tma", choices=["off", "on", "both"], default="both",
                    help="forward: k and v by pointer loads, TMA descriptors, or both")  # fmt: skip
    ap.add_argument("--flush-l2", action="store_true",
                    help="write 256 MiB before each timed rep, so no operand starts in L2")  # fmt: skip
    ap.add_argument("--kernel-time", action="store_true",
                    help="time the kernels alone (profiler records), not the calls around them")  # fmt: skip
    ap.add_argument("--bwd-kernels", default="DKDV,DQ",
                    help="backward: the kernels whose shapes to vary, one at a time (the other's "
                         "shipped)")  # fmt: skip
    ap.add_argument("--bwd-block-qs", default="32,64,128", help="backward: query rows to try")
    ap.add_argument("--bwd-block-ks", default="32,64,128", help="backward: key rows to try")
    ap.add_argument("--bwd-warps", default="4,8", help="backward: warps to try")
    ap.add_argument("--bwd-stages", default="2,3", help="backward: pipeline stages to try")
    ap.add_argument("--json")
    args = ap.parse_args()
    unknown = set(args.bwd_kernels.split(",")) - {"DKDV", "DQ"}
    if unknown:
        ap.error(f"--bwd-kernels takes DKDV and/or DQ, not {', '.join(sorted(unknown))}")
    if args.kernel_time:
        _KERNEL_TIME.append(True)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined
    elif args.flush_l2:
        _FLUSH.append(True)
    if args.decode:
        return decode_sweep(args)

    from contractgen.adapters.kernels.triton import attention as fwd
    from contractgen.adapters.kernels.triton import attention_bwd as bwd
    from contractgen.codegen.vendored import load_target

    kp = load_target("sglang").schema.kernel_policy_for("qwen3_dense_true_on_policy_v1")
    H, KVH, D = (int(x) for x in args.heads.split(","))
    B, S, dev = args.batch, args.seq, args.device
    T = B * S
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v, d_out = (
        torch.randn(T, h, D, device=dev, generator=g).to(torch.bfloat16) for h in (H, KVH, KVH, H)
    )
    pos = torch.arange(S, device=dev).repeat(B)
    cu = torch.arange(B + 1, dtype=torch.int32) * S  # on the host, as the trainer keeps them
    kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu)
    shipped = (fwd.BLOCK_Q, fwd.NUM_WARPS, fwd.NUM_STAGES)
    o_ref, lse = fwd.triton_attention_lse(q, k, v, pos, kp, **kw)
    rows = []
    sdpa = None
    if dev != "cpu":  # the stock forward on the same batch, for scale
        import torch.nn.functional as F

        qs, ks, vs = (t.view(B, S, -1, D).transpose(1, 2) for t in (q, k, v))
        sdpa = _ms(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True,
                                                          enable_gqa=True))  # fmt: skip
        print(f"SDPA forward {sdpa:.3f} ms", flush=True)

    def run_fwd():
        return fwd.triton_attention_lse(q, k, v, pos, kp, **kw)

    tmas = {"off": (False,), "on": (True,), "both": (False, True)}[args.tma]
    keep_tma = fwd.TMA_KV
    for bq, warps, stages, tma in itertools.product(
        [int(b) for b in args.block_qs.split(",")], (4, 8),
        [int(n) for n in args.stages.split(",")], tmas,
    ):  # fmt: skip
        fwd.BLOCK_Q, fwd.NUM_WARPS, fwd.NUM_STAGES, fwd.TMA_KV = bq, warps, stages, tma
        row = {"kernel": "forward", "BLOCK_Q": bq, "num_warps": warps, "num_stages": stages,
               "tma": tma, "sdpa_ms": sdpa}  # fmt: skip
        try:
            row["ms"] = _ms(run_fwd)
            row["bits_equal_shipped"] = torch.equal(run_fwd()[0], o_ref)
        except Exception as e:  # out of shared memory / registers: record and go on
            row["error"] = f"{type(e).__name__}: {str(e)[:120]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    fwd.BLOCK_Q, fwd.NUM_WARPS, fwd.NUM_STAGES = shipped
    fwd.TMA_KV = keep_tma

    def run_bwd():
        return bwd.triton_attention_backward(q, k, v, o_ref, lse, d_out, pos, kp, **kw)

    kernels = () if args.forward_only else args.bwd_kernels.split(",")
    base = {name: dict(getattr(bwd, name)) for name in ("DKDV", "DQ")}
    want = None if args.forward_only else run_bwd()
    if not args.forward_only:  # the shipped shapes
        again = run_bwd()
        row = {"kernel": "shipped", "backward_ms": _ms(run_bwd),
               "repeats_bitwise": all(map(torch.equal, want, again))}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    shapes = [[int(x) for x in getattr(args, a).split(",")]
              for a in ("bwd_block_qs", "bwd_block_ks", "bwd_warps", "bwd_stages")]  # fmt: skip
    for name in kernels:
        for bq, bk, warps, stages in itertools.product(*shapes):
            cfg = {"BLOCK_Q": bq, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages}
            setattr(bwd, name, cfg)
            row = {"kernel": name, **cfg}
            try:
                row["backward_ms"] = _ms(run_bwd)
                got, again = run_bwd(), run_bwd()
                row["max_rel_diff_vs_shipped"] = max(
                    float((a.float() - b.float()).norm() / b.float().norm())
                    for a, b in zip(got, want, strict=True)
                )
                row["repeats_bitwise"] = all(map(torch.equal, got, again))
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e)[:120]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
        setattr(bwd, name, base[name])

    for kernel, key in [("forward", "ms")] + [(k, "backward_ms") for k in kernels]:
        ok = sorted((r for r in rows if r["kernel"] == kernel and key in r), key=lambda r: r[key])
        print(f"\n{kernel}: fastest of {len(ok)} (ms)")
        for r in ok[:5]:
            print("  ", {k: v for k, v in r.items() if k != "kernel"})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"batch": B, "seq": S, "heads": [H, KVH, D], "rows": rows}, f, indent=1)


def decode_sweep(args) -> None:
    """One decode step of ``--batch`` requests at ``--decode`` keys each: heads per tile (every
    divisor of the GQA ratio), warps and stages, timed against SDPA, bits against the shipped
    choice. The tile keeps its 64 query rows (the forward sweep covers other heights)."""
    import torch.nn.functional as F

    from contractgen.adapters.kernels.triton import attention as fwd
    from contractgen.codegen.vendored import load_target

    kp = load_target("sglang").schema.kernel_policy_for("qwen3_dense_true_on_policy_v1")
    H, KVH, D = (int(x) for x in args.heads.split(","))
    B, ctx, dev = args.batch, args.decode, args.device
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, H, D, device=dev, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B * ctx, KVH, D, device=dev, generator=g).to(torch.bfloat16) for _ in "kv")
    pos = torch.full((B,), ctx - 1, device=dev)
    cu_q = torch.arange(B + 1)  # on the host, as the engine passes them
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_q * ctx)
    shipped = fwd.triton_attention(q, k, v, pos, kp, **kw)
    chosen = fwd.head_group(H // KVH, 1)
    ks, vs = (t.view(B, ctx, KVH, D).repeat_interleave(H // KVH, 2).transpose(1, 2) for t in (k, v))
    sdpa = _ms(lambda: F.scaled_dot_product_attention(q[:, :, None], ks, vs))
    keep = (fwd.head_group, fwd.NUM_WARPS, fwd.NUM_STAGES, fwd.TMA_KV)
    rows = []
    groups = [n for n in range(1, H // KVH + 1) if (H // KVH) % n == 0]
    tmas = {"off": (False,), "on": (True,), "both": (False, True)}[args.tma]
    for group, warps, stages, tma in itertools.product(groups, (4, 8), (2, 3, 4, 5), tmas):
        fwd.head_group = lambda *a, group=group: group
        fwd.NUM_WARPS = warps
        fwd.NUM_STAGES = stages
        fwd.TMA_KV = tma
        row = {"kernel": "decode", "group": group, "num_warps": warps, "num_stages": stages,
               "tma": tma, "sdpa_ms": sdpa, "shipped_group": chosen}  # fmt: skip
        try:
            row["ms"] = _ms(lambda: fwd.triton_attention(q, k, v, pos, kp, **kw))
            row["time_x_sdpa"] = row["ms"] / sdpa
            row["bits_equal_shipped"] = torch.equal(
                fwd.triton_attention(q, k, v, pos, kp, **kw), shipped
            )
        except Exception as e:  # out of shared memory / registers: record and go on
            row["error"] = f"{type(e).__name__}: {str(e)[:120]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    fwd.head_group, fwd.NUM_WARPS, fwd.NUM_STAGES, fwd.TMA_KV = keep
    ok = sorted((r for r in rows if "ms" in r), key=lambda r: r["ms"])
    print(f"\ndecode {B} x 1 at {ctx} keys, SDPA {sdpa:.3f} ms; shipped group {chosen}; fastest:")
    for r in ok[:6]:
        print("  ", {k: r[k] for k in ("group", "num_warps", "num_stages", "tma", "ms",
                                       "time_x_sdpa", "bits_equal_shipped")})  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"batch": B, "decode_keys": ctx, "heads": [H, KVH, D], "rows": rows}, f,
                      indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
