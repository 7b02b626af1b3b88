"""Kernel-library benchmark: the Triton backend against cuBLAS / SDPA on an H200, with the bits
checked in the same process. Prints one table per section and writes everything to ``--json``.

    python3 benchmarks/bench_kernels.py --device cuda --json $OUT/kernels.json
    python3 benchmarks/bench_kernels.py --small          # CPU smoke run (Triton's interpreter, tiny shapes)

Sections (``--sections``): ``linear`` (Qwen3-4B projections, M = 1..8192: time vs ``F.linear``,
batch invariance, equality with a per-tile ``torch.mm(out_dtype=float32)`` mimic and, given
``--sglang`` (a scratch copy of SGLang's ``tp_invariant_ops.py``, never committed), with SGLang's
``matmul_tp_persistent``), ``memory`` (extra memory of one linear and of LM head + log-softmax),
``attention`` (prefill 4k / 16k and decode at 4k vs SDPA flash; prefill/decode bit equality),
``rollout`` (reference engine, Qwen3-0.6B shape: decode steps with the contract ops vs stock ops).
"""

# ruff: noqa: B023  (timed lambdas run inside the loop iteration that defines them)

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from bench_kernel_helpers import (  # tune_matmul.py and linear_host_overhead.py import these from here
    CONTRACT,
    SHAPES,
    SMALL_SHAPES,
    Timer,
    _peak,
    _r,
    load_sglang,
    mimic_matmul,
)
from bench_kernels_attention import bench_attention


def bench_linear(args, kp, tm, res):
    from contractgen.adapters.kernels.triton.matmul import triton_matmul

    dev = args.device
    sg = load_sglang(args.sglang)
    shapes = SMALL_SHAPES if args.small else SHAPES
    if args.shape_order == "reversed":
        shapes = shapes[::-1]
    ms_list = [1, 3, 16] if args.small else [int(m) for m in args.ms.split(",")]
    rows = []
    for name, N, K in shapes:
        w = _r(N, K, device=dev, seed=1, scale=K**-0.5)
        for M in ms_list:
            x = _r(M, K, device=dev, seed=2)
            y = triton_matmul(x, w, kp)
            row = {"shape": name, "M": M, "N": N, "K": K}
            row["cublas_ms"] = tm.ms(lambda: F.linear(x, w))
            row["triton_ms"] = tm.ms(lambda: triton_matmul(x, w, kp))
            flop = 2 * M * N * K
            row["triton_tflops"] = flop / row["triton_ms"] / 1e9
            row["cublas_tflops"] = flop / row["cublas_ms"] / 1e9
            row["time_ratio"] = row["triton_ms"] / row["cublas_ms"]
            if args.cuda_graph and dev == "cuda":
                row["cublas_graph_ms"] = tm.graph_ms(lambda: F.linear(x, w))
                row["triton_graph_ms"] = tm.graph_ms(lambda: triton_matmul(x, w, kp))
                row["graph_time_ratio"] = row["triton_graph_ms"] / row["cublas_graph_ms"]
            idx = sorted({0, M // 2, M - 1})
            row["batch_invariant"] = all(
                torch.equal(triton_matmul(x[i : i + 1], w, kp)[0], y[i]) for i in idx
            )
            if dev == "cuda" and kp.matmul_tile_order == "sglang_first_level":
                row["equals_mimic"] = torch.equal(y, mimic_matmul(x, w, kp))
                if sg is not None:
                    ys = sg.matmul_tp_persistent(x, w.t())
                    row["equals_sglang"] = torch.equal(y, ys)
                    row["sglang_ms"] = tm.ms(lambda: sg.matmul_tp_persistent(x, w.t()))
            ref64 = x.double() @ w.double().T
            row["rel_err"] = float((y.double() - ref64).norm() / ref64.norm())
            rows.append(row)
            print(json.dumps(row), flush=True)
        # TP=2 split (row-parallel): both halves + the fixed tree == TP=1
        if K % 256 == 0:
            from contractgen.adapters.kernels.matmul import shard_policy

            x = _r(64, K, device=dev, seed=3)
            acc = getattr(torch, kp.matmul_accumulation_dtype)
            h, half = K // 2, shard_policy(kp, 2)
            a = triton_matmul(x[:, :h].contiguous(), w[:, :h].contiguous(), half, out_dtype=acc)
            b = triton_matmul(x[:, h:].contiguous(), w[:, h:].contiguous(), half, out_dtype=acc)
            res.setdefault("tp2_split_equal", {})[name] = torch.equal(
                (a + b).to(x.dtype), triton_matmul(x, w, kp)
            )
    res["linear"] = rows
    print(f"\n{'shape':<18}{'M':>6}{'cuBLAS ms':>11}{'triton ms':>11}{'time x':>8}"
          f"{'TFLOP/s':>9}{'inv':>5}{'mimic':>7}{'sglang':>8}{'sg ms':>8}")  # fmt: skip
    for r in rows:
        print(f"{r['shape']:<18}{r['M']:>6}{r['cublas_ms']:>11.4f}{r['triton_ms']:>11.4f}"
              f"{r['time_ratio']:>8.2f}{r['triton_tflops']:>9.1f}{str(r['batch_invariant'])[0]:>5}"
              f"{str(r.get('equals_mimic', '-'))[0]:>7}{str(r.get('equals_sglang', '-'))[0]:>8}"
              f"{r.get('sglang_ms', float('nan')):>8.3f}")  # fmt: skip
    if any("graph_time_ratio" in r for r in rows):
        print(f"\nCUDA graph (host launch cost excluded)\n{'shape':<18}{'M':>6}{'cuBLAS ms':>11}"
              f"{'triton ms':>11}{'time x':>8}")  # fmt: skip
        for r in rows:
            print(f"{r['shape']:<18}{r['M']:>6}{r['cublas_graph_ms']:>11.4f}"
                  f"{r['triton_graph_ms']:>11.4f}{r['graph_time_ratio']:>8.2f}")  # fmt: skip
    print("tp2 split == tp1:", res.get("tp2_split_equal"))


def bench_memory(args, kp, tm, res):
    from contractgen.adapters.kernels.logsoftmax import lm_head_token_logprobs
    from contractgen.adapters.kernels.matmul import reference_matmul
    from contractgen.adapters.kernels.triton.matmul import triton_matmul

    dev = args.device
    M, K, N = (64, 256, 320) if args.small else (4096, 2560, 9728)
    x, w = _r(M, K, device=dev), _r(N, K, device=dev, seed=1, scale=K**-0.5)
    out_gib = M * N * 2 / 2**30
    rows = {
        "linear_shape": [M, K, N],
        "linear_output_gib": out_gib,
        "linear_torch_ref_extra_gib": _peak(lambda: reference_matmul(x, w, kp), dev) - out_gib,
        "linear_triton_extra_gib": _peak(lambda: triton_matmul(x, w, kp), dev) - out_gib,
        "linear_torch_ref_ms": tm.ms(lambda: reference_matmul(x, w, kp), reps=20),
    }
    V, H = (1000, 128) if args.small else (151936, 1024)
    wv = _r(V, H, device=dev, seed=4, scale=H**-0.5)
    for T in [1, 512, 2048] if not args.small else [1, 64]:
        h = _r(T, H, device=dev, seed=5)
        ids = torch.randint(0, V, (T,), device=dev)
        rows[f"lm_head_logprobs_T{T}_gib"] = _peak(
            lambda h=h, ids=ids: lm_head_token_logprobs(h, wv, ids, kp, V), dev
        )
        rows[f"lm_head_logprobs_T{T}_ms"] = tm.ms(
            lambda h=h, ids=ids: lm_head_token_logprobs(h, wv, ids, kp, V), reps=20
        )
    res["memory"] = rows
    print("\nmemory:", json.dumps(rows, indent=1), flush=True)


def _random_bf16_weights(arch, dev) -> dict:
    """Seeded bf16 weights of ``arch``'s shapes: norms near 1, linears scaled by 1/sqrt(K)."""
    from contractgen.adapters.common.model import weight_shapes  # after main sets TRITON_INTERPRET

    g = torch.Generator(device=dev).manual_seed(0)
    weights = {}
    for name, shape in weight_shapes(arch).items():
        if "norm" in name:
            t = 1.0 + 0.1 * torch.randn(shape, generator=g, device=dev)
        elif "embed_tokens" in name:
            t = torch.randn(shape, generator=g, device=dev)
        else:
            t = torch.randn(shape, generator=g, device=dev) / shape[1] ** 0.5
        weights[name] = t.to(torch.bfloat16)
    return weights


def _time_decode(model, lp_fn, prompts, caches, steps: int, dev) -> tuple[float, list[float]]:
    """``(prefill seconds, each greedy decode step's seconds)`` of ``model`` over ``prompts``."""
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    lp = lp_fn(model.forward(torch.cat(prompts).to(dev), caches, [len(p) for p in prompts]))
    sync()
    prefill_s = time.perf_counter() - t0
    tok = lp.argmax(-1)
    ts = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        tok = lp_fn(model.forward(tok, caches, [1] * len(prompts))).argmax(-1)
        sync()
        ts.append(time.perf_counter() - t0)
    return prefill_s, ts


def bench_rollout(args, kp, tm, res):
    """Decode steps of the reference engine's model, Qwen3-0.6B shape: contract ops (the
    registry's backend) vs stock ops (switches off, cuBLAS linears, SDPA, bf16 log-softmax)."""
    import contractgen.adapters.sglang.model as model_mod
    from contractgen.adapters.kernels import stock
    from contractgen.adapters.kernels.logsoftmax import full_logprobs
    from contractgen.adapters.sglang.model import KVCache, ModelArch, ReferenceModel
    from contractgen.codegen.vendored import load_target

    dev = args.device
    gen = load_target("sglang")
    profile = gen.schema.model_profile_for(CONTRACT)
    if args.small:
        arch = ModelArch.from_profile(profile)
        batch, prompt, steps = 2, 16, 3
    else:
        dims = next(d for d in profile.checkpoints if d.name == "Qwen3-0.6B")
        arch = ModelArch.from_profile(profile, dims)
        batch, prompt, steps = args.batch, 128, args.steps
    rp_on = gen.runtime_policy.policy_for(CONTRACT, SimpleNamespace(tp_size=1))
    rp_off = dataclasses.replace(rp_on, enabled=False)
    orig_attention = model_mod.chunked_attention

    def sdpa_packed(q, k, v, q_positions, kp, *, cu_seqlens_q=None, cu_seqlens_k=None, **kw):
        cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        outs = []
        for i in range(len(cu_q) - 1):
            qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
            o = stock.sdpa_attention(q[qs], k[ks], v[ks], q_positions[qs], kp)
            outs.append(o.to(q.dtype))
        return torch.cat(outs)

    weights = _random_bf16_weights(arch, dev)
    gp = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, arch.vocab_size, (prompt,), generator=gp) for _ in range(batch)]
    out = {"model": arch.name, "layers": arch.num_layers, "batch": batch, "prompt": prompt}
    for variant in ("contract", "stock"):
        model_mod.chunked_attention = orig_attention
        model = ReferenceModel(arch, weights, kp, rp_on if variant == "contract" else rp_off,
                               device=dev)  # fmt: skip
        if variant == "stock":
            lin = lambda x, w, kp, **kw: F.linear(x, w.to(x.dtype))  # noqa: E731
            model.ops = dataclasses.replace(
                model.ops, column_linear=lin, row_partial=lin,
                lm_head=lambda h, w, kp: F.linear(h.to(w.dtype), w),
            )  # fmt: skip
            model_mod.chunked_attention = sdpa_packed
        lp_fn = (
            (lambda lg: full_logprobs(lg, kp, arch.vocab_size))
            if variant == "contract"
            else (lambda lg: torch.log_softmax(lg[:, : arch.vocab_size].bfloat16(), -1))
        )
        caches = [KVCache() for _ in range(batch)]
        prefill_s, ts = _time_decode(model, lp_fn, prompts, caches, steps, dev)
        out[variant] = {
            "prefill_s": prefill_s,
            "decode_step_median_ms": statistics.median(ts[2:] or ts) * 1e3,
            "steps": steps,
        }
        print(json.dumps({variant: out[variant]}), flush=True)
        del model
    model_mod.chunked_attention = orig_attention
    c, s = out["contract"], out["stock"]
    out["decode_time_ratio"] = c["decode_step_median_ms"] / s["decode_step_median_ms"]
    res["rollout"] = out
    print(f"\nrollout {arch.name} batch {batch}: decode step contract "
          f"{c['decode_step_median_ms']:.1f} ms, stock {s['decode_step_median_ms']:.1f} ms, "
          f"{out['decode_time_ratio']:.2f}x")  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="tiny shapes (CPU smoke run)")
    ap.add_argument("--sections", default="attention,memory,rollout,linear")
    ap.add_argument("--sglang", default=None, help="scratch copy of SGLang's tp_invariant_ops.py")
    ap.add_argument("--ms", default="1,16,64,4096,8192", help="linear: row counts M")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="linear: also time both sides replayed from a CUDA graph")  # fmt: skip
    ap.add_argument("--shape-order", choices=["listed", "reversed"], default="listed",
                    help="linear: the order the shapes run in (first-shape effects)")  # fmt: skip
    ap.add_argument("--attention-cases", default="prefill,decode,training",
                    help="attention: which rows to run")  # fmt: skip
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--contract", default=CONTRACT, help="whose kernel policy (default: v1)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.device == "cpu":  # the Triton kernels run in the interpreter (set before they load)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from contractgen.adapters.kernels.registry import backend_for
    from contractgen.codegen.vendored import load_target

    kp = load_target("sglang").schema.kernel_policy_for(args.contract)
    tm = Timer(args.device)
    res = {
        "contract": args.contract,
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "backend": backend_for(args.device),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv),
    }
    print(json.dumps(res), flush=True)
    sections = {"linear": bench_linear, "memory": bench_memory, "attention": bench_attention,
                "rollout": bench_rollout}  # fmt: skip
    for name in args.sections.split(","):
        try:
            sections[name](args, kp, tm, res)
        except Exception as e:  # keep the other sections' numbers
            res[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:500]}"
            print(f"section {name} failed: {res[f'{name}_error']}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
