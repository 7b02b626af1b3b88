"""How the rollout's weights are placed on TP ranks and gathered back: shard helpers of the
column / row / vocab splits (``ReferenceModel.__init__``, ``gathered_weights``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes and values, compared in the wider dtype (widening is exact: no float64
    copies of a vocab-sized table)."""
    wide = torch.promote_types(a.dtype, b.dtype)
    return a.shape == b.shape and torch.equal(a.to(wide), b.to(wide))


def _shard_of(shard: Callable, n: int, t: torch.Tensor) -> torch.Tensor:
    """``shard(t, n)`` (argument order for ``functools.partial``)."""
    return shard(t, n)


def _parts_rows(
    parts: Sequence[int], rank: int, tp: int, dtype: torch.dtype, t: torch.Tensor
) -> torch.Tensor:
    """This rank's rows of each concatenated part of ``t`` (``parts`` row counts), joined."""
    chunks = t.split(list(parts))
    rows = [
        c[rank * (n // tp) : (rank + 1) * (n // tp)] for c, n in zip(chunks, parts, strict=True)
    ]
    return torch.cat(rows).to(dtype).contiguous()


def _parts_gather(parts: Sequence[int], shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """Inverse of ``_parts_rows`` over every rank's shard."""
    tp = len(shards)
    pieces = [s.split([n // tp for n in parts]) for s in shards]
    return torch.cat([torch.cat([p[j] for p in pieces]) for j in range(len(parts))])


def _vocab_rows(t: torch.Tensor, rank: int, per: int) -> torch.Tensor:
    """Rows ``rank * per ..`` of ``t`` zero-padded to ``per`` rows (the vocab padding falls in
    the last shards): a view when the shard holds no padding, so the table is never copied whole."""
    lo, hi = rank * per, (rank + 1) * per
    if hi <= t.shape[0]:
        return t[lo:hi]
    pad = t.new_zeros(hi - max(lo, t.shape[0]), *t.shape[1:])
    return torch.cat([t[lo:], pad])
