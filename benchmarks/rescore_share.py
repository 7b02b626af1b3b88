"""Time the prefill re-score pass that the v2 contract (decode logprobs) saves.

Under v1 (``sglang_prefill``) every finished rollout is re-scored by one prefill pass before the
trainer's logprobs can be compared; under v2 the decode-step logprobs are used as they are. This
script runs the reference rollout on the contract's reference model and reports, per run, the
time of generation (prefill + decode with KV cache) and of the re-score pass, and the re-score's
share of the total. Prints a table; timings are medians over ``--repeats`` runs.

    .venv/bin/python benchmarks/rescore_share.py [--device cpu|cuda] [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=8, help="concurrent requests per run")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per request")
    args = parser.parse_args(argv)

    from contractgen.adapters.common.rollout import RolloutJob
    from contractgen.adapters.common.workload import PromptSpec
    from contractgen.adapters.sglang.model import ModelArch, random_weights
    from contractgen.adapters.sglang.session import RolloutSession
    from contractgen.codegen.vendored import load_target

    contract = "qwen3_dense_true_on_policy_v1"
    arch = ModelArch.from_profile(load_target("sglang").schema.model_profile_for(contract))
    weights = random_weights(arch, seed=0)
    workload = tuple(
        PromptSpec(f"r{i}", 16 + 24 * i, args.new_tokens, 0.0, i, i % 3)
        for i in range(args.requests)
    )
    job = RolloutJob(contract, weights, 1, workload, device=args.device)
    rows = []
    with RolloutSession(1, args.device) as session:
        session.run(job)  # warm-up: first-call allocations and lazy imports
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            result = session.run(job)
            rows.append((result.generate_seconds, result.rescore_seconds, time.perf_counter() - t0))
    gen = statistics.median(r[0] for r in rows)
    res = statistics.median(r[1] for r in rows)
    tokens = sum(len(s) for s in result.sequences)
    scored = sum(len(lp) for lp in result.decode_logprobs)
    device = (
        torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu"
    )
    print(
        f"reference model {arch.name}: {arch.num_layers} layers, hidden {arch.hidden_size}; "
        f"{args.requests} requests, {scored} generated tokens, {tokens} tokens re-scored"
    )
    print(
        f"device {args.device} ({device}), torch {torch.__version__}, {args.repeats} runs (median)"
    )
    print()
    print(f"{'phase':<34}{'seconds':>10}{'share':>8}")
    print(f"{'generate (prefill + decode, KV)':<34}{gen:>10.3f}{gen / (gen + res):>8.1%}")
    print(f"{'prefill re-score (v1 only)':<34}{res:>10.3f}{res / (gen + res):>8.1%}")
    print(f"{'total under v1':<34}{gen + res:>10.3f}{1:>8.0%}")
    print(f"{'total under v2 (no re-score)':<34}{gen:>10.3f}{gen / (gen + res):>8.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
