"""Test helpers: tensor parallelism across processes on CPU (gloo; ranks from ``contractgen.adapters.common.workers``).

``spawn(n, fn, *args)`` runs ``fn(rank, n, *args)`` on ``n`` fresh processes sharing one gloo
process group (the default group) and returns the per-rank results; a worker's traceback is
re-raised in the parent. ``tp_rollout`` runs the reference rollout at a TP size and returns rank
0's completions and rescores.

Policies cross the process boundary as plain dicts and come back as attribute namespaces: the
kernels only read attributes, and the generated classes live in a loader-made module that a spawned
process cannot unpickle.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import traceback
from collections.abc import Callable, Sequence
from types import SimpleNamespace

import torch
import torch.distributed as dist


def plain(policy) -> dict:
    """A policy dataclass as a plain dict (picklable)."""
    return dataclasses.asdict(policy)


def namespace(d: dict) -> SimpleNamespace:
    return SimpleNamespace(**d)


def _entry(rank: int, commands, results, world: int, tmp: str) -> None:
    """One rank of ``spawn``: joins the gloo group, runs each ``(fn, args)`` it is sent."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world
    )
    try:
        while (command := commands.get()) is not None:
            fn, args = command
            try:
                results.put((rank, "ok", fn(rank, world, *args)))
            except Exception:
                results.put((rank, "err", traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def spawn(world_size: int, fn: Callable, *args, timeout: float = 300.0) -> list:
    """``[fn(rank, world_size, *args) for rank in ranks]``, each rank in its own process (a
    ``RankPool`` for one command); a rank's traceback is raised here."""
    from contractgen.adapters.common.workers import RankPool

    with tempfile.TemporaryDirectory(prefix="contractgen-tp-") as tmp:
        pool = RankPool(f"TP={world_size} workers", world_size, _entry, (world_size, tmp),
                        timeout_s=timeout)  # fmt: skip
        try:
            replies = pool.send((fn, args), f"TP={world_size} worker")
        finally:
            pool.close()
    return [replies[r][1] for r in range(world_size)]


def rollout_on_rank(arch, weights, kp, rp, requests=(), rescore=(), layer_outputs=False) -> dict:
    """The rollout on this rank of an initialised default group (call inside a ``spawn`` worker).

    ``kp``/``rp`` may be dicts (from ``plain``) or policy objects."""
    from contractgen.adapters.common.checkpoint import load_safetensors
    from contractgen.adapters.sglang.engine import RolloutEngine
    from contractgen.adapters.sglang.model import ReferenceModel, random_weights

    if isinstance(weights, int):
        weights = random_weights(arch, seed=weights)
    elif isinstance(weights, (str, os.PathLike)):
        weights = load_safetensors(weights)
    kp, rp = (namespace(p) if isinstance(p, dict) else p for p in (kp, rp))
    model = ReferenceModel(arch, weights, kp, rp, group=None)
    eng = RolloutEngine(model, progress=model.rank == 0)
    out = eng.generate(requests)
    completions = {rid: (c.tokens, c.logprob_tensor()) for rid, c in out.items()}
    scores, layers = [], []
    for seq in rescore:
        lo: list = []
        scores.append(eng.rescore(seq, layer_outputs=lo if layer_outputs else None))
        layers.append(lo)
    return {"completions": completions, "rescores": scores, "layer_outputs": layers}


def _rollout_worker(rank, world, *args):
    return rollout_on_rank(*args)


def tp_rollout(
    tp_size: int,
    arch,
    kp,
    rp,
    requests: Sequence = (),
    *,
    weights: int | str | os.PathLike = 0,
    rescore: Sequence[Sequence[int]] = (),
    layer_outputs: bool = False,
) -> dict:
    """The reference rollout at ``tp_size`` ranks (gloo). ``weights``: a seed for random weights
    or a checkpoint directory. Returns rank 0's ``{"completions": {rid: (tokens, logprobs)},
    "rescores": [...], "layer_outputs": [...]}`` after checking every rank got the same bits."""
    args = (arch, weights, plain(kp), plain(rp), list(requests), [list(s) for s in rescore])
    results = spawn(tp_size, _rollout_worker, *args, layer_outputs)
    first = results[0]
    for r, res in enumerate(results[1:], start=1):
        for rid, (tokens, lp) in first["completions"].items():
            other = res["completions"][rid]
            if other[0] != tokens or not torch.equal(other[1], lp):
                raise AssertionError(f"TP={tp_size}: rank {r} disagrees with rank 0 on {rid}")
    return first
