"""Rollout decode step, ms per step: today's packed forward vs the static decode path
(``adapters/sglang/decode_graph.py``) eagerly vs the same step replayed as a CUDA graph, side by
side in one process, against the bytes bound.

The model is the contract's profile at Qwen3-0.6B's dims (``--model``; random weights from
``model.random_weights``, held in the dense dtype, TP=1). ``--batch`` requests with prompts of
``--prompt`` tokens are prefilled once per mode (one packed forward, not timed), then ``--steps``
decode steps feed the same pre-drawn tokens in every mode; each step is timed alone (wall clock,
``torch.cuda.synchronize`` around it) and the median reported. Every mode's logits are compared
with the packed forward's bit for bit (``same_bits``): the fast paths must not change a bit.

Bound: the bytes one step must read (every weight once, plus every request's keys and values
in every layer at the steps' mean position) over the H200's 4.3e12 B/s.

    python benchmarks/bench_rollout.py --device cuda --json $OUT/rollout.json
    python benchmarks/bench_rollout.py --device cuda --batch 32 --prompt 512 --steps 64
    python benchmarks/bench_rollout.py --small --device cpu    # smoke run: the tiny model
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from types import SimpleNamespace

import torch

HBM_BYTES_PER_S = 4.3e12  # H200 HBM3e peak


def _build(args):
    from contractgen.adapters.sglang.model import ModelArch, ReferenceModel, random_weights
    from contractgen.codegen.vendored import load_target

    gen = load_target("sglang")
    profile = gen.schema.model_profile_for(args.contract)
    if args.small:
        arch = ModelArch.from_profile(profile)
    else:
        known = [d.name for d in profile.checkpoints]
        dims = next((d for d in profile.checkpoints if d.name == args.model), None)
        if dims is None:
            sys.exit(f"--model {args.model!r} is not in {args.contract}'s profile; known: {known}")
        arch = ModelArch.from_profile(profile, dims)
    if args.layers:
        arch = dataclasses.replace(arch, num_layers=args.layers)
    kp = gen.schema.kernel_policy_for(args.contract)
    rp = gen.runtime_policy.policy_for(args.contract, SimpleNamespace(tp_size=1))
    weights = random_weights(arch, seed=0)
    return arch, ReferenceModel(arch, weights, kp, rp, device=args.device)


def _bound_ms(model, batch: int, mean_keys: float) -> tuple[float, int, float]:
    """(ms, weight bytes, KV bytes): reading every weight once and every K/V row a step sees."""
    weights = [model.embed, model.final_norm, model.lm_head]
    for layer in model.layers:
        for f in dataclasses.fields(layer):
            t = getattr(layer, f.name)
            weights.extend(t if isinstance(t, list) else [t] if t is not None else [])
    w_bytes = sum(t.numel() * t.element_size() for t in weights)
    w_bytes -= model.embed.numel() * model.embed.element_size()  # a step reads `batch` rows of it
    w_bytes += batch * model.embed.shape[1] * model.embed.element_size()
    kv_row = 2 * model.kvl * model.arch.head_dim * model.embed.element_size()  # K and V
    kv_bytes = len(model.layers) * batch * mean_keys * kv_row
    return (w_bytes + kv_bytes) / HBM_BYTES_PER_S * 1e3, w_bytes, kv_bytes


def _timed(fn, steps: int, sync) -> tuple[list[float], list[torch.Tensor]]:
    times, outs = [], []
    for s in range(steps):
        sync()
        t0 = time.perf_counter()
        outs.append(fn(s))
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return times, outs


# "-ref": the same mode with the PyTorch reference of the small ops (RMSNorm, RoPE, SiLU-GLU) on every
# backend: the baseline of their one-kernel Triton versions, in the same process
MODES = ("eager", "static", "graph", "static-ref", "graph-ref")
SMALL_OPS = ("rms_norm", "apply_rope", "silu_glu")
_SHIPPED: dict[str, str] = {}


def _reference_small_ops(on: bool) -> None:
    """Point the Triton backend's small ops at their PyTorch references (``on``) or back."""
    from contractgen.adapters.kernels import registry

    for op in SMALL_OPS:
        _SHIPPED.setdefault(op, registry.BACKENDS["triton"][op])
        registry.BACKENDS["triton"][op] = registry.BACKENDS["torch"][op] if on else _SHIPPED[op]
    registry._resolve.cache_clear()


def _profile(step, steps: int, top: int) -> list[dict]:
    """``steps`` decode steps under ``torch.profiler``: the ``top`` kernels by device time, in ms
    per step, with their share of all kernel time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for s in range(steps):
            step(s)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    total = sum(e.self_device_time_total for e in events) or 1
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    rows = [
        {
            "kernel": e.key[:100],
            "calls_per_step": e.count / steps,
            "ms_per_step": e.self_device_time_total / 1e3 / steps,
            "share": e.self_device_time_total / total,
        }
        for e in events[:top]
    ]
    rows.append({"kernel": "ALL", "ms_per_step": total / 1e3 / steps, "share": 1.0})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="the contract's tiny model, 4 x 16 + 4")
    ap.add_argument("--contract", default="qwen3_dense_true_on_policy_v1")
    ap.add_argument("--model", default="Qwen3-0.6B", help="a dims entry of the profile")
    ap.add_argument("--layers", type=int, default=None, help="override num_layers")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16, help="timed decode steps per mode")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (graph capture)")
    ap.add_argument("--modes", default="eager,static,graph")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--profile", type=int, default=0, metavar="N",
        help="after timing, profile --steps static decode steps (eager, the graph's kernels) and "
        "print the N costliest kernels, ms per step",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if args.small:
        args.batch, args.prompt, args.steps, args.warmup = 3, 16, 4, 1
    cuda = torch.device(args.device).type == "cuda"
    modes = [m for m in args.modes.split(",") if not m.startswith("graph") or cuda]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"--modes: unknown {', '.join(unknown)}; known: {', '.join(MODES)}")

    from contractgen.adapters.sglang.decode_graph import DecodeRunner
    from contractgen.adapters.sglang.model import KVCache

    def sync():
        if cuda:
            torch.cuda.synchronize()

    arch, model = _build(args)
    B, P, total = args.batch, args.prompt, args.warmup + args.steps
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, arch.vocab_size, (B, P), generator=g)
    feed = torch.randint(0, arch.vocab_size, (total, B), generator=g).tolist()
    results = {
        "arch": dataclasses.asdict(arch),
        "contract": args.contract,
        "batch": B,
        "prompt": P,
        "steps": args.steps,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "modes": {},
    }
    ref = None
    for mode in modes:
        _reference_small_ops(mode.endswith("-ref"))
        caches = [KVCache(capacity_hint=P + total) for _ in range(B)]
        if mode == "eager":
            pool, step = model.new_kv_pool(), None
        else:
            runner = DecodeRunner(
                model, rows=B * (P + total), max_keys=P + total, max_batch=B,
                graphs=mode.startswith("graph"),
            )  # fmt: skip
            pool = runner.pool
        for c in caches:
            c.make_room(pool, 0)
        model.forward(prompts.reshape(-1), caches, [P] * B)  # prefill (not timed)
        if mode == "eager":

            def step(s, caches=caches):
                return model.forward(torch.tensor(feed[s]), caches, [1] * B)
        else:

            def step(s, caches=caches, runner=runner):
                for c in caches:
                    c.make_room(runner.pool, 1)
                return runner.step(feed[s], caches)

        t0 = time.perf_counter()
        for s in range(args.warmup):
            step(s)
        sync()
        warm_s = time.perf_counter() - t0
        times, outs = _timed(lambda s: step(args.warmup + s), args.steps, sync)  # noqa: B023
        logits = torch.stack([o.float().cpu() for o in outs])
        ref = logits if ref is None else ref
        results["modes"][mode] = {
            "ms_per_step": statistics.median(times),
            "ms_min": min(times),
            "warmup_s": warm_s,
            "same_bits": bool(torch.equal(logits.view(torch.int32), ref.view(torch.int32))),
        }
        print(json.dumps({mode: results["modes"][mode]}), flush=True)
        if args.profile and cuda and mode.startswith("static"):
            results[f"profile_{mode}"] = _profile(
                lambda s, step=step: step(args.warmup + s), args.steps, args.profile
            )
            for row in results[f"profile_{mode}"]:
                print(json.dumps(row), flush=True)
    bound, w_bytes, kv_bytes = _bound_ms(model, B, P + args.warmup + args.steps / 2)
    results.update(bound_ms=bound, weight_bytes=w_bytes, kv_bytes=kv_bytes)
    print(f"\n{arch.name}, {B} requests, prompt {P}, {args.steps} steps, {results['device']}")
    print(f"{'mode':<8} {'ms/step':>10} {'min':>10} {'x bound':>9} {'same bits':>10}")
    for mode, row in results["modes"].items():
        ms = row["ms_per_step"]
        print(
            f"{mode:<8} {ms:>10.3f} {row['ms_min']:>10.3f} {ms / bound:>9.1f} "
            f"{row['same_bits']!s:>10}"
        )
    print(
        f"{'bound':<8} {bound:>10.3f}   (weights {w_bytes / 1e9:.3f} GB + KV {kv_bytes / 1e9:.3f} GB"
        f" per step at {HBM_BYTES_PER_S:.1e} B/s)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0 if all(r["same_bits"] for r in results["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
