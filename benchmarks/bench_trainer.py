"""Trainer cost: megatron-core GPTModel with contractgen's ``SGLangSpecProvider`` spec
(``SGLangGPTModel``, the contract's config from ``make_config``) vs megatron-core's stock
``get_gpt_layer_local_spec`` GPTModel (same dims, bf16, ``transformer_impl='local'``, RoPE, causal
``DotProductAttention``, no fusions: the same non-fused settings make_config uses) vs transformers'
``Qwen3ForCausalLM`` with SDPA attention and cuBLAS bf16 linears (``hf_sdpa``: what an FSDP/HF
trainer runs, built as ``../shared/bench/hf_trainer_baseline.py`` builds it), one process,
TP=PP=CP=1, random init, Qwen3-0.6B shapes by default.

Per model: ``B`` sequences of ``S`` tokens, the same token ids for every model (SGLang: packed into
one row with ``SGLangPackedSeqParams``; stock and HF: a ``[B, S]`` batch). Loss: megatron's
vocab-parallel cross entropy summed over every position (megatron models), HF: the baseline's
``cross_entropy(logits.float()[:, :-1], ids[:, 1:], reduction="sum")``. ``fsdp``: the fsdp trainer
target's model (transformers' Qwen3 with the contract's ops, ``fully_shard`` over this one
process), the same sequences packed into one row, cross entropy summed over every position. Timed: forward without
grad (the logprob pass: logits only, for all three), forward with grad and the loss, backward. One
warm-up iteration, then the median of ``--iters``; peak memory from the build on. The table gives
each model's times over ``hf_sdpa``'s.

    python3 benchmarks/bench_trainer.py --device cuda --batch 32 --seq 512 --models sglang,stock,hf_sdpa \
        --contract v3 --json $OUT/trainer_v3.json   # 16k packed tokens, issue 32's row
    python3 benchmarks/bench_trainer.py --device cuda --json $OUT/trainer.json
    python3 benchmarks/bench_trainer.py --device cpu --small --models sglang,stock,hf_sdpa  # smoke
    python3 benchmarks/bench_trainer.py --device cuda --batch 32 --seq 512 --models fsdp,hf_sdpa

The team's baseline script of 2026-11-30 (``../shared/bench``), kept here so the issue-10 trainer
row is measured with the same code before and after.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
import traceback

import torch
from bench_trainer_models import CONTRACT, MODELS, build_case  # diag scripts use bt.build_case

# ``--contract`` shorthands
CONTRACT_ALIASES = {f"v{n}": f"qwen3_dense_true_on_policy_v{n}" for n in (1, 2, 3, 4)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def megatron_loss(logits, targets):
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    return vocab_parallel_cross_entropy(logits.float(), targets).sum()


def time_model(name, model, make_inputs, targets_fn, iters, dev):
    loss_of = getattr(model, "loss", megatron_loss)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    inputs = make_inputs()
    targets = targets_fn()
    fwd_ng, fwd, bwd = [], [], []
    for it in range(iters + 1):
        model.eval()
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            model(**inputs)
        sync()
        t1 = time.perf_counter()
        model.train()
        model.zero_grad(set_to_none=True)
        logits = model(**inputs)
        loss = loss_of(logits, targets)
        sync()
        t2 = time.perf_counter()
        loss.backward()
        sync()
        t3 = time.perf_counter()
        if it:
            fwd_ng.append(t1 - t0)
            fwd.append(t2 - t1)
            bwd.append(t3 - t2)
        del logits, loss
    r = {
        "forward_nograd_s": statistics.median(fwd_ng),
        "forward_grad_s": statistics.median(fwd),
        "backward_s": statistics.median(bwd),
        "fwd_bwd_s": statistics.median(a + b for a, b in zip(fwd, bwd, strict=False)),
        "params": sum(p.numel() for p in model.parameters()),
        "tokens": int(targets.numel()),
    }
    if cuda:
        r["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return r


def profile_step(model, make_inputs, targets_fn, top: int) -> list[dict]:
    """One training forward + backward under ``torch.profiler``: the ``top`` kernels by total
    device time (name, calls, total ms, share of all kernel time)."""
    from torch.profiler import ProfilerActivity, profile

    loss_of = getattr(model, "loss", megatron_loss)
    inputs, targets = make_inputs(), targets_fn()
    model.train()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.zero_grad(set_to_none=True)
        loss = loss_of(model(**inputs), targets)
        loss.backward()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(e.self_device_time_total for e in events) or 1
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    return [
        {
            "kernel": e.key[:90],
            "calls": e.count,
            "total_ms": e.self_device_time_total / 1e3,
            "share": e.self_device_time_total / total,
        }
        for e in events[:top]
    ]


def ratios(r: dict, base: dict) -> dict:
    """``r``'s times and peak memory over ``base``'s (the ``hf_sdpa`` row)."""
    keys = ("fwd_bwd_s", "forward_nograd_s", "forward_grad_s", "backward_s", "peak_gib")
    return {k: r[k] / base[k] for k in keys if r.get(k) and base.get(k)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="contract's tiny reference model")
    ap.add_argument("--model", default="Qwen3-0.6B")
    ap.add_argument("--contract", default=CONTRACT,
                    help=f"contract id, or {', '.join(CONTRACT_ALIASES)} (default v1)")  # fmt: skip
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--models", default="sglang,stock", help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--profile", type=int, default=0, metavar="N",
        help="after timing, profile one training step per model and print its N costliest kernels",
    )  # fmt: skip
    args = ap.parse_args(argv)
    import dataclasses

    from contractgen.adapters.megatron import runtime
    from contractgen.adapters.megatron.model import Layout, arch_for
    from contractgen.adapters.megatron.policy import model_profile_for

    contract = CONTRACT_ALIASES.get(args.contract, args.contract)
    names = args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)}; known: {', '.join(MODELS)}")
    if args.small:
        arch = arch_for(contract)
        args.batch, args.seq, args.iters = 2, 32, 1
    else:
        dims = next(d for d in model_profile_for(contract).checkpoints if d.name == args.model)
        arch = arch_for(contract, dims)
    if args.layers:
        arch = dataclasses.replace(arch, num_layers=args.layers)
    from contractgen.adapters.common.distributed import Rendezvous

    rendezvous = Rendezvous()  # the store the rank joins, served while it runs
    runtime.init_distributed(0, Layout(), rendezvous.port, device=args.device)
    dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, arch.vocab_size, (args.seq,), generator=g) for _ in range(args.batch)]
    res = {
        "contract": contract,
        "arch": dataclasses.asdict(arch),
        "batch": args.batch,
        "seq": args.seq,
        "iters": args.iters,
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "models": {},
    }
    print(json.dumps({k: v for k, v in res.items() if k != "models"}), flush=True)
    for name in names:
        t0 = time.perf_counter()
        model = None
        try:
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            model, make_inputs, targets_fn = build_case(name, arch, dev, seqs, contract)
            build_s = time.perf_counter() - t0
            r = time_model(name, model, make_inputs, targets_fn, args.iters, dev)
            r["build_s"] = build_s
            if args.profile and dev.type == "cuda":
                r["profile"] = profile_step(model, make_inputs, targets_fn, args.profile)
                print(f"\n{name}: costliest kernels of one training step")
                for k in r["profile"]:
                    print(
                        f"{k['total_ms']:9.2f} ms {k['share']:6.1%} {k['calls']:6d}x  {k['kernel']}"
                    )
        except Exception as e:
            r = {
                "error": f"{type(e).__name__}: {str(e)[:400]}",
                "traceback": traceback.format_exc()[-2000:],
            }
        res["models"][name] = r
        skip = ("traceback", "profile")
        print(json.dumps({name: {k: v for k, v in r.items() if k not in skip}}), flush=True)
        if "traceback" in r:
            print(r["traceback"], flush=True)
        model = None
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    runtime.shutdown()
    m = res["models"]
    base = m.get("hf_sdpa", {})
    for r in m.values():
        if "error" not in r and "error" not in base and base and r is not base:
            r["vs_hf_sdpa"] = ratios(r, base)
    print()
    print(
        f"{arch.name}, {arch.num_layers} layers, {args.batch} x {args.seq} tokens, {dev.type}, "
        f"{contract}"
    )
    print(
        f"{'model':<9}{'fwd no-grad (s)':>16}{'fwd (s)':>10}{'bwd (s)':>10}{'fwd+bwd (s)':>13}"
        f"{'peak GiB':>10}{'fwd+bwd/hf':>12}{'no-grad/hf':>12}{'peak/hf':>9}"
    )
    for name, r in m.items():
        if "error" in r:
            print(f"{name:<9} ERROR {r['error'][:200]}")
            continue
        vs = r.get("vs_hf_sdpa", {})

        def ratio(key, vs=vs):
            return f"{vs[key]:.2f}x" if key in vs else "-"

        print(
            f"{name:<9}{r['forward_nograd_s']:>16.3f}{r['forward_grad_s']:>10.3f}"
            f"{r['backward_s']:>10.3f}{r['fwd_bwd_s']:>13.3f}{r.get('peak_gib', 0):>10.2f}"
            f"{ratio('fwd_bwd_s'):>12}{ratio('forward_nograd_s'):>12}{ratio('peak_gib'):>9}"
        )
    if all("fwd_bwd_s" in m.get(k, {}) for k in ("sglang", "stock")):
        print(
            f"sglang/stock: fwd+bwd {m['sglang']['fwd_bwd_s'] / m['stock']['fwd_bwd_s']:.2f}x, "
            f"fwd no-grad {m['sglang']['forward_nograd_s'] / m['stock']['forward_nograd_s']:.2f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
