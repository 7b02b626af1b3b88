"""Where a cold rollout's time goes: the gate's workload (``make_workload``: staggered arrivals,
prompts of different lengths, seeded sampling) on one rollout engine in this process, with every
Triton compile counted per phase: generate (cold), re-score every sequence (prefill), then both
again (warm). The JSON lists each compiled kernel with the constexprs that set it apart.

    python3 benchmarks/cold_rollout.py --device cuda --contract qwen3_dense_true_on_policy_v3 \\
        --model Qwen3-0.6B --requests 8 --new-tokens 128 --json out.json
    python3 benchmarks/cold_rollout.py --device cpu --small --new-tokens 4   # smoke
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import triton
from bench_rollout import _build

COMPILES: list[dict] = []
_STARTED: dict = {}


def _info(kwargs) -> tuple[str, dict]:
    fn, spec = kwargs.get("fn"), kwargs.get("compile") or {}
    consts = {str(k): repr(v) for k, v in (spec.get("constants") or {}).items()}
    return getattr(fn, "name", repr(fn)), consts


def _before(*args, **kwargs):
    """Triton's ``jit_cache_hook``: a kernel is about to compile (or load from the disk cache)."""
    _STARTED[repr(kwargs.get("key"))] = time.perf_counter()
    return False


def _after(*args, **kwargs):
    """Triton's ``jit_post_compile_hook``: one record per compiled kernel, with its seconds."""
    name, consts = _info(kwargs)
    t0 = _STARTED.pop(repr(kwargs.get("key")), None)
    seconds = round(time.perf_counter() - t0, 3) if t0 is not None else None
    COMPILES.append({"kernel": name, "seconds": seconds, "constexprs": consts})
    return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="the contract's tiny model")
    ap.add_argument("--contract", default="qwen3_dense_true_on_policy_v3")
    ap.add_argument("--model", default="Qwen3-0.6B")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=70)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--decode", default="auto", help="RolloutEngine decode mode")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from contractgen.adapters.common.rollout import requests_for
    from contractgen.adapters.sglang.engine import RolloutEngine
    from contractgen.parity.workload import make_workload

    triton.knobs.runtime.jit_cache_hook = _before
    triton.knobs.runtime.jit_post_compile_hook = _after
    arch, model = _build(args)
    work = make_workload(args.requests, args.prompt_tokens, args.new_tokens)
    reqs = requests_for(work, arch.vocab_size)
    engine = RolloutEngine(model, progress=False, decode=args.decode)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    phases, seqs = [], None
    for attempt in ("cold", "warm"):
        for phase in ("generate", "rescore"):
            before = len(COMPILES)
            sync()
            t0 = time.perf_counter()
            if phase == "generate":
                done = engine.generate(reqs)
                seqs = [list(r.prompt) + list(done[r.rid].tokens) for r in reqs]
            else:
                for s in seqs:
                    engine.rescore(s)
            sync()
            new = COMPILES[before:]
            phases.append({
                "phase": f"{phase} ({attempt})", "seconds": round(time.perf_counter() - t0, 3),
                "compiles": len(new),
                "compile_seconds": round(sum(c["seconds"] or 0 for c in new), 2),
                "by_kernel": dict(collections.Counter(c["kernel"] for c in new)),
            })  # fmt: skip
    print(f"\n{arch.name}, {args.contract}, {args.requests} requests, {args.new_tokens} new tokens, "
          f"decode {engine.decode_mode()}, {args.device}")  # fmt: skip
    print(f"{'phase':<20} {'seconds':>8} {'compiles':>9} {'compile s':>10}  by kernel")
    for p in phases:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(p["by_kernel"].items()))
        print(
            f"{p['phase']:<20} {p['seconds']:>8.2f} {p['compiles']:>9} {p['compile_seconds']:>10.2f}  {kinds}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"phases": phases, "compiles": COMPILES}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
