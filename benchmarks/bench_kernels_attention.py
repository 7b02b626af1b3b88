"""bench_kernels.py's ``attention`` section: prefill 4k / 16k and decode at 4k against SDPA flash
(prefill/decode bit equality), and the training rows (forward + backward against SDPA)."""

# ruff: noqa: B023  (timed lambdas run inside the loop iteration that defines them)

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from bench_kernel_helpers import _peak, _r


def bench_attention(args, kp, tm, res):
    from contractgen.adapters.kernels.attention import reference_attention
    from contractgen.adapters.kernels.triton.attention import triton_attention

    dev = args.device
    H, KVH, D = (4, 2, 32) if args.small else (32, 8, 128)
    rows = []
    cases = args.attention_cases.split(",")
    for L in ([128] if args.small else [4096, 16384]) if "prefill" in cases else []:
        q, k, v = (_r(L, h, D, device=dev, seed=s) for s, h in ((0, H), (1, KVH), (2, KVH)))
        pos = torch.arange(L, device=dev)
        o = triton_attention(q, k, v, pos, kp)
        qs = q.permute(1, 0, 2)[None]
        ks = k.repeat_interleave(H // KVH, 1).permute(1, 0, 2)[None].contiguous()
        vs = v.repeat_interleave(H // KVH, 1).permute(1, 0, 2)[None].contiguous()
        row = {"case": f"prefill {L}", "L": L}
        tm.both(
            row,
            lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True),
            lambda: triton_attention(q, k, v, pos, kp),
        )
        p = L - 1
        od = triton_attention(q[p:], k, v, pos[p:], kp)
        row["decode_row_equals_prefill"] = torch.equal(od[0], o[p])
        ref = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)[0].permute(1, 0, 2)
        row["rel_err_vs_sdpa"] = float((o.float() - ref.float()).norm() / ref.float().norm())
        if L <= 4096:
            row["torch_ref_ms"] = tm.ms(lambda: reference_attention(q, k, v, pos, kp), reps=5)
            row["torch_ref_peak_gib"] = _peak(lambda: reference_attention(q, k, v, pos, kp), dev)
        row["triton_peak_gib"] = _peak(lambda: triton_attention(q, k, v, pos, kp), dev)
        rows.append(row)
        print(json.dumps(row), flush=True)
    # decode: B sequences, one query each at position ctx-1, against a ctx-long cache
    if "decode" in cases:
        B, ctx = (2, 128) if args.small else (8, 4096)
        q = _r(B, H, D, device=dev)
        k, v = _r(B * ctx, KVH, D, device=dev, seed=1), _r(B * ctx, KVH, D, device=dev, seed=2)
        # the pack's offsets on the host, as the reference engine passes them (on the device, each
        # call's ``.tolist()`` would wait for the GPU)
        cu_q = torch.arange(B + 1)
        cu_k = torch.arange(B + 1) * ctx
        pos = torch.full((B,), ctx - 1, device=dev, dtype=torch.int32)
        qs = q[:, :, None, :]
        ks = k.view(B, ctx, KVH, D).repeat_interleave(H // KVH, 2).permute(0, 2, 1, 3).contiguous()
        vs = v.view(B, ctx, KVH, D).repeat_interleave(H // KVH, 2).permute(0, 2, 1, 3).contiguous()
        kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        row = {"case": f"decode {B}x1 @ {ctx}", "L": ctx}
        tm.both(
            row,
            lambda: F.scaled_dot_product_attention(qs, ks, vs),
            lambda: triton_attention(q, k, v, pos, kp, **kw),
        )
        rows.append(row)
    if "training" in cases:
        rows.extend(_attention_training_rows(args, kp, tm, H, KVH, D))
    res["attention"] = rows
    print(f"\n{'attention':<22}{'SDPA ms':>10}{'triton ms':>11}{'time x':>8}{'kernels: SDPA':>15}"
          f"{'triton':>9}{'x':>7}{'ref ms':>9}")  # fmt: skip
    for r in rows:
        print(f"{r['case']:<22}{r['sdpa_ms']:>10.3f}{r['triton_ms']:>11.3f}{r['time_ratio']:>8.2f}"
              f"{r['sdpa_kernel_ms']:>15.3f}{r['triton_kernel_ms']:>9.3f}"
              f"{r['kernel_time_ratio']:>7.2f}{r.get('torch_ref_ms', float('nan')):>9.1f}")  # fmt: skip
    for r in rows:  # the fwd+bwd rows' SDPA expands K/V in the timed call; its own GQA is faster
        if "sdpa_gqa_ms" in r:
            print(f"{r['case']:<22}{r['sdpa_gqa_ms']:>10.3f}{r['triton_ms']:>11.3f}"
                  f"{r['time_ratio_vs_sdpa_gqa']:>8.2f}{r['sdpa_gqa_kernel_ms']:>15.3f}"
                  f"{r['triton_kernel_ms']:>9.3f}"
                  f"{r['triton_kernel_ms'] / r['sdpa_gqa_kernel_ms']:>7.2f}   (SDPA enable_gqa)")  # fmt: skip


def _attention_training_rows(args, kp, tm, H, KVH, D):
    """Forward + backward over a packed batch (the trainer's attention): the Triton forward with
    log-sum-exp and the Triton backward vs SDPA forward + autograd backward on ``[B, H, S, D]``."""
    from contractgen.adapters.kernels.triton.attention import triton_attention_lse
    from contractgen.adapters.kernels.triton.attention_bwd import triton_attention_backward

    dev, rows = args.device, []
    for B, S in [(2, 64)] if args.small else [(32, 512), (4, 4096)]:
        T = B * S
        q, k, v = (_r(T, h, D, device=dev, seed=s) for s, h in ((0, H), (1, KVH), (2, KVH)))
        d_out = _r(T, H, D, device=dev, seed=3)
        pos = torch.arange(S, device=dev).repeat(B)
        # offsets on the host, as the trainer's packs keep them (``cu_seqlens_host``)
        cu = torch.arange(B + 1, dtype=torch.int32) * S
        kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu)

        def ours():
            o, lse = triton_attention_lse(q, k, v, pos, kp, **kw)
            return triton_attention_backward(q, k, v, o, lse, d_out, pos, kp, **kw)

        def to_b(t, rep):
            return t.view(B, S, -1, D).repeat_interleave(rep, 2).transpose(1, 2)

        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

        def sdpa():
            qs, ks, vs = to_b(leaves[0], 1), to_b(leaves[1], H // KVH), to_b(leaves[2], H // KVH)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
            return torch.autograd.grad(o, leaves, to_b(d_out, 1))

        def sdpa_gqa():  # the KV heads as they are: SDPA's own GQA (``enable_gqa``)
            qs, ks, vs = (t.view(B, S, -1, D).transpose(1, 2) for t in leaves)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
            return torch.autograd.grad(o, leaves, to_b(d_out, 1))

        row = {"case": f"fwd+bwd {B}x{S}", "L": T}
        tm.both(row, sdpa, ours)
        if tm.cuda:  # the baseline without the K/V expansion, beside it
            row["sdpa_gqa_ms"] = tm.ms(sdpa_gqa)
            row["sdpa_gqa_kernel_ms"] = tm.kernel_ms(sdpa_gqa)
            row["time_ratio_vs_sdpa_gqa"] = row["triton_ms"] / row["sdpa_gqa_ms"]
        got, want = ours(), sdpa()
        row["grad_rel_err_vs_sdpa"] = [
            float((g.float() - w.float()).norm() / w.float().norm())
            for g, w in zip(got, want, strict=True)
        ]
        row["backward_repeats_bitwise"] = all(
            torch.equal(a, b) for a, b in zip(got, ours(), strict=True)
        )
        row["triton_peak_gib"] = _peak(ours, dev)
        row["sdpa_peak_gib"] = _peak(sdpa, dev)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows
