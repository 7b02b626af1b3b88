"""A distributed optimizer for the trainer's data parallelism: megatron-core's
``DistributedOptimizer`` semantics (ZeRO-1: optimizer state sharded over the DP ranks) on the
contract's fixed-order collectives.

megatron-core 0.16.1's ``DistributedOptimizer`` works on DDP's contiguous buffers, which it
allocates on ``torch.cuda.current_device()`` (``benchmarks/megatron_ddp_cpu_probe.py``), and
reduce-scatters with the backend's sum. What this one keeps of it: the gradient buffer
(``data_parallel.GradBuffer``: fp32, every parameter in one flat buffer) cut into ``dp`` equal
contiguous shards (padded to a multiple of ``dp``); a reduce-scatter gives each DP rank the sum of
its shard; each rank holds fp32 main parameters and AdamW state for its shard only and steps
them; the updated shards are all-gathered so every rank holds the whole model again, each
parameter rounded to its dtype from the fp32 main value (megatron's main-to-model copy).

What differs: the reduce-scatter is a gather of shard ``k`` from every rank to rank ``k`` and
``kernels.all_reduce.tree_sum`` there (the DP sum's fixed tree, so a shard's bits are the ones
``GradBuffer.reduce`` gives; a backend reduce-scatter picks its own order); the all-gather moves
the fp32 main shards' bits (megatron gathers the 16-bit model parameters; rounding each gathered
fp32 value on every rank gives those same bits); AdamW is ``torch.optim.AdamW`` over one flat
shard tensor (megatron's without Apex/TE is also torch's), no gradient clipping, no buckets, no
overlap.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..common.run_types import OptimizerSettings
from ..kernels.all_reduce import tree_sum, world_size
from .data_parallel import GradBuffer


def shard_bounds(numel: int, dp: int) -> tuple[int, list[tuple[int, int]]]:
    """``(padded numel, [(lo, hi) of each DP rank's shard])``: ``dp`` equal contiguous shards of
    the flat buffer, padded with zeros to a multiple of ``dp``."""
    size = -(-numel // dp)
    return size * dp, [(r * size, (r + 1) * size) for r in range(dp)]


def reduce_scatter_tree(flat: torch.Tensor, group: Any) -> torch.Tensor:
    """This rank's shard of the sum of ``flat`` over ``group``: shard ``k`` of every rank is
    gathered on rank ``k`` (bits moved, in rank order) and summed in the fixed tree order."""
    group = dist.group.WORLD if group is None else group
    n, me = world_size(group), dist.get_rank(group)
    shards = list(flat.view(n, -1))
    mine = shards[me]
    for k in range(n):
        dst = dist.get_global_rank(group, k)
        parts = [torch.empty_like(mine) for _ in range(n)] if k == me else None
        dist.gather(shards[k].contiguous(), parts, dst=dst, group=group)
        if k == me:
            mine = tree_sum(parts)
    return mine


class ShardedAdamW:
    """AdamW over this DP rank's shard of every trainable parameter (fp32 main values), the
    gradient reduce-scattered from the ``GradBuffer``, the updated shards all-gathered into
    every parameter. ``zero_grad`` and ``step`` as the trainer's optimizer is driven."""

    def __init__(
        self, model: torch.nn.Module, grads: GradBuffer, settings: OptimizerSettings, group: Any
    ) -> None:
        self.grads, self.group = grads, group
        self.dp, self.rank = world_size(group), dist.get_rank(group)
        self.padded, bounds = shard_bounds(grads.flat.numel(), self.dp)
        self.lo, self.hi = bounds[self.rank]
        whole = torch.zeros(self.padded, device=grads.flat.device)
        whole[: grads.flat.numel()] = torch.cat(
            [p.detach().reshape(-1).float() for p in grads.params]
        )
        self.main = torch.nn.Parameter(whole[self.lo : self.hi].clone())
        self.adam = torch.optim.AdamW(
            [self.main],
            lr=settings.lr,
            betas=settings.betas,
            eps=settings.eps,
            weight_decay=settings.weight_decay,
        )
        if settings.clip_grad:
            raise ValueError("gradient clipping is not implemented by the sharded optimizer")

    def zero_grad(self) -> None:
        self.main.grad = None

    def step(self, *, skip_gather: bool = False) -> None:
        """Reduce-scatter the gradient buffer, step this rank's shard, all-gather the shards
        into the model's parameters. ``skip_gather``: keep the other ranks' parts as they were
        (the desynchronising fault, tests only; the rank still joins the collective)."""
        flat = self.grads.flat
        if flat.numel() != self.padded:
            flat = torch.nn.functional.pad(flat, (0, self.padded - flat.numel()))
        self.main.grad = reduce_scatter_tree(flat, self.group) if self.dp > 1 else flat.clone()
        self.adam.step()
        parts = [self.main.detach()]
        if self.dp > 1:  # the fp32 shards' bits, in rank order
            parts = [torch.empty_like(self.main) for _ in range(self.dp)]
            dist.all_gather(parts, self.main.detach(), group=self.group)
        if skip_gather:
            return
        whole = torch.cat(parts)
        lo = 0
        with torch.no_grad():
            for p in self.grads.params:
                p.copy_(whole[lo : lo + p.numel()].view_as(p))  # rounded to p's dtype
                lo += p.numel()
