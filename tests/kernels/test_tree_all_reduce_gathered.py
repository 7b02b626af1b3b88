"""The gathered tree all-reduce (NCCL's path: one gather into a reused buffer, then the tree) on
four gloo ranks: every rank gets ``tree_sum`` of all ranks' partials, bit for bit, across calls
that grow the buffer and then reuse it."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from contractgen.adapters.common.workers import free_port
from contractgen.adapters.kernels import all_reduce, tree_sum

RANKS = 4
SIZES = ((1000,), (3, 1000), (1000,))  # the third call fits in the grown buffer: reused


def _partial(rank: int, shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + sum(shape))
    return torch.randn(*shape, generator=g).to(torch.bfloat16)


def _rank(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    try:
        buffers = []
        for shape in SIZES:
            got = all_reduce._gathered_tree_sum(_partial(rank, shape), None)
            want = tree_sum([_partial(r, shape) for r in range(RANKS)])
            assert torch.equal(got, want), (rank, shape)
            buffers.append(next(iter(all_reduce._GATHER_BUFFERS.values())).data_ptr())
        assert buffers[2] == buffers[1], "a call that fits must reuse the buffer"
    finally:
        dist.destroy_process_group()


def test_gathered_tree_all_reduce_every_rank_equals_tree_sum():
    mp.spawn(_rank, args=(free_port(),), nprocs=RANKS, join=True)
