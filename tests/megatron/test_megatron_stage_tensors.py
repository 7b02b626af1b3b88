"""Vocab shards are padded per shard, never as a whole padded copy of the table, with the bits
the whole padded copy split by rows gave (trainer ``checkpoint._vocab_shard``, rollout
``model._vocab_rows``)."""

from __future__ import annotations

import pytest
import torch

from contractgen.adapters.megatron.checkpoint import _vocab_shard
from contractgen.adapters.sglang.placement import _vocab_rows


def _padded_then_split(t: torch.Tensor, padded: int, rank: int, size: int) -> torch.Tensor:
    """The form used until 2026-12-02: the whole table zero-padded, then split by rows."""
    out = t.new_zeros((padded, *t.shape[1:]))
    out[: t.shape[0]] = t
    return torch.chunk(out, size, dim=0)[rank]


@pytest.mark.parametrize(
    "vocab,padded,size",
    [(1000, 1024, 1), (1000, 1024, 2), (1000, 1024, 4), (1024, 1024, 2), (100, 512, 4)],
)
def test_vocab_shards_equal_the_padded_table_split(vocab, padded, size):
    t = torch.randn(vocab, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    for rank in range(size):
        want = _padded_then_split(t, padded, rank, size)
        for got in (_vocab_shard(t, padded, rank, size), _vocab_rows(t, rank, padded // size)):
            assert got.dtype == want.dtype and torch.equal(got, want)


def test_an_unpadded_shard_is_a_view_of_the_table():
    t = torch.randn(1024, 8)
    assert _vocab_shard(t, 1024, 1, 2).data_ptr() == t[512:].data_ptr()
    assert _vocab_rows(t, 0, 1024).data_ptr() == t.data_ptr()
