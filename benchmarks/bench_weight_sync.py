"""Weight sync of one RL step, seconds by part: the path before the rl-throughput branch against
the one that ships, on one model's HF state dict (``--model``, in the trainer's bf16 storage dtype).

Parts, in the order a step runs them:

- ``trainer_to_parent``: the trainer rank's weights reach the parent process. Before: every
  tensor ``.cpu()``, ``dist.gather_object`` to rank 0 (a pickle of the whole state dict, even at
  world size 1), then the reply through a ``torch.multiprocessing`` queue (each tensor moved to
  shared memory: a copy and a descriptor each). Now: ``SharedTensors.pack`` (each tensor copied
  once into one shared buffer) and the buffer's one descriptor through the queue.
- ``digest``: the parent's ``weights_digest`` of the push (before: ``tobytes`` copies).
- ``rollout_load``: the rollout rank takes the push. Before: a new ``ReferenceModel`` per step
  (and, in the real loop, a new engine: decode graphs recaptured, not timed here). Now:
  ``load_weights_`` into the kept model.
- ``rollout_sync_check``: the shards gathered back and compared with the push. Before: float64
  copies of both sides and a second sha256 of the held weights. Now: bit patterns, and the
  sender's digest when every tensor came back bit for bit.

The trainer rank is a forkserver process as in ``TrainerSession`` (CPU, gloo, world size 1); the
rollout runs in this process, as the TP=1 CPU rollout does. CPU only: on CUDA the trainer's
``.cpu()`` becomes a device-to-host copy straight into the shared buffer, and the rollout's load
a host-to-device copy into the held tensors (the lead's GPU run reports ``time_s.sync``,
``rollout_load`` and ``rollout_sync_check`` of the real loop).

    python benchmarks/bench_weight_sync.py --model Qwen3-0.6B --json $OUT/weight_sync.json
    python benchmarks/bench_weight_sync.py --small     # smoke run: the tiny model
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from types import SimpleNamespace

import torch


def _arch(contract: str, model: str | None):
    from contractgen.adapters.sglang.model import ModelArch
    from contractgen.codegen.vendored import load_target

    profile = load_target("sglang").schema.model_profile_for(contract)
    if model is None:
        return ModelArch.from_profile(profile)
    dims = next((d for d in profile.checkpoints if d.name == model), None)
    if dims is None:
        known = [d.name for d in profile.checkpoints]
        sys.exit(f"--model {model!r} is not in {contract}'s profile; known: {known}")
    return ModelArch.from_profile(profile, dims)


def _state(arch) -> dict[str, torch.Tensor]:
    from contractgen.adapters.sglang.model import random_weights

    return {k: v.to(torch.bfloat16) for k, v in random_weights(arch, seed=0).items()}


def _trainer_rank(rank, commands, results, arch, port) -> None:
    """A trainer rank: holds the weights, answers each ``"old"`` / ``"new"`` with them."""
    import torch.distributed as dist

    from contractgen.adapters.common.distributed import start_process_group
    from contractgen.adapters.common.shared_tensors import SharedTensors

    torch.set_num_threads(1)
    start_process_group(rank, 1, port, "cpu")
    weights = _state(arch)
    results.put(("ready", None, 0.0))
    while (how := commands.get()) is not None:
        t0 = time.monotonic()
        if how == "old":  # gather_hf before: .cpu(), gather_object to rank 0, the dict replied
            mine = {k: v.cpu() for k, v in weights.items()}
            stages = [None]
            dist.gather_object(mine, stages, dst=0)
            results.put(("ok", stages[0], t0))
        else:
            results.put(("ok", SharedTensors.pack(weights), t0))
    dist.destroy_process_group()


def _old_digest(weights) -> str:
    h = hashlib.sha256()
    for name in sorted(weights):
        t = weights[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _old_sync_report(model, pushed) -> dict:
    gathered, problems = model.gathered_weights()
    gathered = {name: value.cpu() for name, value in gathered.items()}
    held = {
        name: gathered[name].to(value.dtype) if name in gathered else torch.zeros(0)
        for name, value in pushed.items()
    }
    mismatched = sorted(
        name
        for name, value in pushed.items()
        if name not in gathered
        or gathered[name].shape != value.shape
        or not torch.equal(gathered[name].double(), value.double())
    )
    return {"synced": not mismatched and not problems, "digest": _old_digest(held)}


def _lap(t0: float) -> float:
    return round(time.perf_counter() - t0, 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contract", default="qwen3_dense_true_on_policy_v3")
    ap.add_argument("--model", default="Qwen3-0.6B")
    ap.add_argument("--small", action="store_true", help="the contract's tiny reference model")
    ap.add_argument("--repeats", type=int, default=2, help="pushes timed per path (best kept)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from contractgen.adapters.common.distributed import Rendezvous
    from contractgen.adapters.common.rollout import sync_report, weights_digest
    from contractgen.adapters.common.workers import rank_context, start_rank
    from contractgen.adapters.sglang.model import ReferenceModel

    torch.set_num_threads(1)
    arch = _arch(args.contract, None if args.small else args.model)
    from contractgen.codegen.vendored import load_target

    g = load_target("sglang")
    kp = g.schema.kernel_policy_for(args.contract)
    rp = g.runtime_policy.policy_for(args.contract, SimpleNamespace(tp_size=1))
    ctx = rank_context("cpu")
    commands, results = ctx.Queue(), ctx.Queue()
    rendezvous = Rendezvous()  # the rank joins its store (kept while the rank runs)
    proc = start_rank(ctx, _trainer_rank, (0, commands, results, arch, rendezvous.port))
    assert results.get(timeout=600)[0] == "ready"
    kept = None
    out: dict = {"model": arch.name, "contract": args.contract, "threads": 1, "paths": {}}
    for how in ("old", "new"):
        best: dict[str, float] = {}
        for _ in range(args.repeats):
            commands.put(how)
            _, payload, t_sent = results.get(timeout=600)
            parts = {"trainer_to_parent": round(time.monotonic() - t_sent, 4)}
            pushed = payload if how == "old" else payload.tensors()
            t0 = time.perf_counter()
            digest = (_old_digest if how == "old" else weights_digest)(pushed)
            parts["digest"] = _lap(t0)
            t0 = time.perf_counter()
            if how == "old":
                model = ReferenceModel(arch, pushed, kp, rp)
            else:
                if kept is None:  # the first push builds the kept model (not timed: once a run)
                    kept = ReferenceModel(arch, pushed, kp, rp, own=True)
                kept.load_weights_(pushed)
                model = kept
            parts["rollout_load"] = _lap(t0)
            t0 = time.perf_counter()
            report = (
                _old_sync_report(model, pushed)
                if how == "old"
                else sync_report(model, pushed, digest)
            )
            parts["rollout_sync_check"] = _lap(t0)
            assert report["synced"] and report["digest"] == digest, report
            parts["total"] = round(sum(parts.values()), 4)
            if not best or parts["total"] < best["total"]:
                best = parts
            del model, pushed, payload
        out["paths"][how] = best
        print(f"{how}: {best}", file=sys.stderr, flush=True)
    commands.put(None)
    proc.join(timeout=60)
    from contractgen.adapters.sglang.model import weight_shapes

    out["parameters"] = sum(math.prod(s) for s in weight_shapes(arch).values())
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
