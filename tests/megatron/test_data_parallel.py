"""The trainer's data-parallel pieces (``adapters/megatron/data_parallel.py``,
``distributed_optimizer.py``) without a model: the batch split, fp32 microbatch accumulation in
order, the fixed-tree DP gradient sum (the same bits on every rank, and not what a sequential
sum gives), the replica check that names a desynchronised parameter, the sharded optimizer
(bit for bit the replicated AdamW on the tree-summed gradient, on every rank), and the ``dp``
axis of the one ``Layout`` type. The end-to-end run
(``parity --train-steps`` at ``dp2``) is ``tests/parity/test_training_dp.py``."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from contractgen.adapters.common.data_parallel import microbatches, split_batch
from contractgen.adapters.common.layout import LayoutError, parse_layout
from contractgen.adapters.common.run_types import OptimizerSettings
from contractgen.adapters.common.workers import free_port
from contractgen.adapters.kernels.all_reduce import tree_sum
from contractgen.adapters.megatron.data_parallel import (
    GradBuffer,
    replica_mismatches,
    replica_tensors,
)
from contractgen.adapters.megatron.distributed_optimizer import ShardedAdamW, shard_bounds


def test_split_batch_spreads_the_groups_and_keeps_microbatch_order():
    # 2 prompts x 4 samples: every DP rank gets samples of both prompts, in order
    assert split_batch(8, 2, 0, 2) == [[0, 2], [4, 6]]
    assert split_batch(8, 2, 1, 2) == [[1, 3], [5, 7]]
    assert split_batch(8, 1, 0, 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    for dp in (1, 2, 4):
        for count in (1, 2):
            parts = [i for r in range(dp) for mb in split_batch(8, dp, r, count) for i in mb]
            assert sorted(parts) == list(range(8)), (dp, count)  # a partition of the batch


def test_too_many_microbatches_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="3 sequences cannot fill 4 microbatches"):
        microbatches([0, 2, 4], 4)


def _fp32(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _bf16(seed: int, *shape: int) -> torch.Tensor:
    return _fp32(seed, *shape).to(torch.bfloat16)


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3, 5, dtype=torch.bfloat16))
        self.b = torch.nn.Parameter(torch.zeros(1000, dtype=torch.float32))  # full-mantissa grads


def test_microbatch_gradients_add_into_fp32_main_grad_in_order():
    model = _Tiny()
    buf = GradBuffer(model)
    grads = [(_bf16(k, 3, 5), _fp32(10 + k, 1000)) for k in range(3)]
    for gw, gb in grads:
        model.w.grad, model.b.grad = gw.clone(), gb.clone()
        buf.accumulate()
        assert model.w.grad is None and model.b.grad is None  # DDP's hook drops .grad
    want_w = torch.zeros(3, 5)
    for gw, _ in grads:  # ((0 + g0) + g1) + g2, in float32
        want_w = want_w + gw.float()
    assert model.w.main_grad.dtype == torch.float32
    assert torch.equal(model.w.main_grad, want_w)
    assert torch.equal(model.b.main_grad, (grads[0][1] + grads[1][1]) + grads[2][1])
    # one flat buffer: the views write through, and zero() clears every microbatch's sum
    assert model.w.main_grad.data_ptr() == buf.flat.data_ptr()
    buf.zero()
    assert not buf.flat.any() and not model.w.main_grad.any()


RANKS = 4


def _rank(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    try:
        model = _Tiny()
        buf = GradBuffer(model)
        for k in range(2):  # two microbatches of rank-specific gradients
            model.w.grad = _bf16(100 * rank + k, 3, 5)
            model.b.grad = _fp32(100 * rank + 50 + k, 1000)
            buf.accumulate()
        local = buf.flat.clone()
        buf.reduce(None)
        everyone = [torch.empty_like(local) for _ in range(RANKS)]
        dist.all_gather(everyone, local)
        # the fixed tree over the ranks' fp32 sums, bit for bit, on every rank
        assert torch.equal(buf.flat, tree_sum(everyone)), rank
        reduced = [torch.empty_like(buf.flat) for _ in range(RANKS)]
        dist.all_gather(reduced, buf.flat)
        assert all(torch.equal(reduced[0].view(torch.int32), r.view(torch.int32)) for r in reduced)
        # and it is an order: a sequential sum (as a ring may add) gives other bits for these
        # full-mantissa fp32 sums
        sequential = ((everyone[0] + everyone[1]) + everyone[2]) + everyone[3]
        assert not torch.equal(sequential, buf.flat)

        # replicas equal: nothing named; one bit flipped on rank 3: that tensor, everywhere
        assert replica_mismatches(replica_tensors(model), None) == []
        if rank == RANKS - 1:
            with torch.no_grad():
                model.b.view(torch.int32)[4] ^= 1
        assert replica_mismatches(replica_tensors(model), None) == ["b"]

        # the desync fault: the last rank keeps its own gradient, the others still get the sum
        buf.flat.copy_(local)
        buf.reduce(None, skip=rank == RANKS - 1)
        want = local if rank == RANKS - 1 else tree_sum(everyone)
        assert torch.equal(buf.flat, want), rank
        _sharded_step_equals_the_replicated_one(rank, local, tree_sum(everyone))
    finally:
        dist.destroy_process_group()


def _sharded_step_equals_the_replicated_one(
    rank: int, local: torch.Tensor, summed: torch.Tensor
) -> None:
    """``ShardedAdamW`` (reduce-scatter, AdamW on a quarter of the padded 1015 values,
    all-gather) against torch's AdamW on every parameter's fp32 copy with the whole summed
    gradient, rounded to the parameter's dtype: the same bits, on every rank, over two steps."""
    settings = OptimizerSettings(lr=1e-2)
    model, ref = _Tiny(), _Tiny()
    with torch.no_grad():
        for k, (p, q) in enumerate(zip(model.parameters(), ref.parameters(), strict=True)):
            p.copy_(_fp32(7 + k, *p.shape))
            q.copy_(p)
    buf = GradBuffer(model)
    opt = ShardedAdamW(model, buf, settings, None)
    assert (opt.hi - opt.lo, opt.padded) == (254, 1016)
    mains = [q.detach().float().clone().requires_grad_() for q in ref.parameters()]
    adam = torch.optim.AdamW(mains, lr=settings.lr, betas=settings.betas, eps=settings.eps,
                             weight_decay=settings.weight_decay)  # fmt: skip
    for _ in range(2):
        buf.flat.copy_(local)
        opt.zero_grad()
        opt.step()
        lo = 0
        for m in mains:
            m.grad = summed[lo : lo + m.numel()].view_as(m).clone()
            lo += m.numel()
        adam.step()
        for p, q, m in zip(model.parameters(), ref.parameters(), mains, strict=True):
            with torch.no_grad():
                q.copy_(m)
            assert torch.equal(p, q), (rank, p.dtype)
    gathered = [torch.empty_like(model.b) for _ in range(RANKS)]
    dist.all_gather(gathered, model.b.detach())
    assert all(torch.equal(g, gathered[0]) for g in gathered)


def test_shard_bounds_pad_to_equal_contiguous_shards():
    assert shard_bounds(1015, 4) == (1016, [(0, 254), (254, 508), (508, 762), (762, 1016)])
    assert shard_bounds(8, 1) == (8, [(0, 8)])


def test_dp_gradient_sum_is_one_fixed_tree_on_every_rank_and_a_desync_is_named():
    """Also the sharded optimizer's step (``_sharded_step_equals_the_replicated_one``)."""
    mp.spawn(_rank, args=(free_port(),), nprocs=RANKS, join=True)


@pytest.mark.parametrize(
    ("token", "name", "ranks", "label"),
    [
        ("dp2", "dp2", 2, "tp1pp1cp1dp2"),
        ("tp2dp2", "tp2dp2", 4, "tp2pp1cp1dp2"),
        ("dp2tp2", "tp2dp2", 4, "tp2pp1cp1dp2"),
        ("tp2", "tp2", 2, "tp2pp1cp1"),
    ],
)
def test_dp_layouts_parse_and_count_their_ranks(token, name, ranks, label):
    lay = parse_layout(token)
    assert (lay.name, lay.world_size, lay.trainer_label) == (name, ranks, label)
    assert lay.sizes["dp"] == (2 if "dp" in token else 1)


def test_dp_with_ep_is_refused():
    with pytest.raises(LayoutError, match="dp and ep together are not supported"):
        parse_layout("dp2ep2")
