"""Data parallelism for the trainer: megatron-core DDP's gradient semantics with the contract's
fixed-order reduction.

Why not megatron-core's own ``DistributedDataParallel``: in 0.16.1 its ``_ParamAndGradBuffer``
allocates the gradient (and, for the distributed optimizer, parameter) buffers on
``torch.cuda.current_device()`` with no device option, so wrapping a CPU stage fails with "Torch
not compiled with CUDA enabled" (``/tmp`` repro in the branch's report); and its reduction is a
backend all-reduce or reduce-scatter (NCCL / gloo choose the order). Its distributed optimizer
works on those CUDA buffers, so it cannot run here either (``distributed_optimizer.py`` is this
trainer's).

What this layer keeps of megatron DDP: an fp32 ``main_grad`` per parameter, views of one
contiguous buffer (``grad_reduce_in_fp32``); each microbatch's gradient added into it in
microbatch order and ``.grad`` dropped (DDP's backward hook: ``main_grad.add_(grad)``); after the
last microbatch one reduction over the data-parallel group; the optimizer reading ``main_grad``
(megatron's ``_copy_model_grads_to_main_grads``). The loss is megatron's
``calculate_per_token_loss`` form: every rank divides by the step's *global* response-token
count, so the DP reduction is a plain sum (scale 1).

What differs, and why: the sum is ``kernels.all_reduce.tree_all_reduce`` (every rank's bits
gathered, adjacent pairs summed level by level), so every DP rank gets the same bits by
construction, whatever the backend would have summed in; it is synchronous (no buckets, no
overlap with the backward). Without the distributed optimizer every DP rank keeps the whole
optimizer and takes the same step on the same gradient; with it (``ShardedAdamW``) the buffer is
reduce-scattered instead and the updated shards all-gathered. Either way the replicas stay
bit-identical, and ``replica_mismatches`` checks it every step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from ..kernels.all_reduce import tree_all_reduce, world_size


class GradBuffer:
    """An fp32 ``main_grad`` for every trainable parameter of ``model``, views of one flat buffer
    (its parameters in ``model.parameters()`` order), as megatron DDP's grad buffer."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        device = self.params[0].device
        self.flat = torch.zeros(sum(p.numel() for p in self.params), device=device)
        lo = 0
        for p in self.params:
            p.main_grad = self.flat[lo : lo + p.numel()].view_as(p)
            lo += p.numel()

    def zero(self) -> None:
        self.flat.zero_()
        for p in self.params:
            p.grad = None

    def accumulate(self) -> None:
        """Add every parameter's ``.grad`` (one microbatch's) into its ``main_grad`` and drop
        it; called once per microbatch, so the fp32 sum runs in microbatch order."""
        for p in self.params:
            if p.grad is not None:
                p.main_grad.add_(p.grad)
                p.grad = None

    def reduce(self, group: Any, *, skip: bool = False) -> None:
        """Sum the buffer over ``group`` in the fixed tree order (the same bits on every rank).
        ``skip``: keep this rank's own gradient (the desynchronising fault, tests only)."""
        if world_size(group) == 1 or skip:
            # a skipping rank still joins the collective, so its peers do not wait forever
            if skip:
                tree_all_reduce(self.flat, group)
            return
        self.flat.copy_(tree_all_reduce(self.flat, group))


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (bit patterns: ``-0.0`` and ``0.0`` differ)."""
    data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()


def replica_mismatches(named: Iterable[tuple[str, torch.Tensor]], group: Any) -> list[str]:
    """Names of the tensors whose bits differ between the ranks of ``group`` (the DP replicas of
    one TP/PP/CP position), by sha256 of each. Collective over ``group``; every rank gets the
    same list."""
    names, digests = [], []
    for name, t in named:
        names.append(name)
        digests.append(tensor_digest(t))
    n = world_size(group)
    if n == 1:
        return []
    every: list[Any] = [None] * n
    dist.all_gather_object(every, (names, digests), group=group)
    first_names, first = every[0]
    out = []
    for other_names, other in every[1:]:
        if other_names != first_names:
            return [f"parameter lists differ: {first_names[:3]} vs {other_names[:3]}"]
        out += [nm for nm, a, b in zip(first_names, first, other, strict=True) if a != b]
    return sorted(set(out))


def replica_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """What must be identical on every DP replica: each parameter and, where the mixed-precision
    optimizer keeps one, its fp32 main copy (``<name>#main``)."""
    out: list[tuple[str, torch.Tensor]] = []
    for name, p in model.named_parameters():
        out.append((name, p))
        main = getattr(p, "main_param", None)
        if main is not None:
            out.append((f"{name}#main", main))
    return out
