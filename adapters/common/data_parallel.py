"""The trainer role's data-parallel split: which sequences a data-parallel rank scores and how they
are cut into microbatches. A function of its arguments only, so every rank agrees without talking;
every trainer target splits a batch this one way. Standard library only."""

from __future__ import annotations

from collections.abc import Sequence


def dp_share(n: int, dp: int, dp_rank: int) -> list[int]:
    """The sequences (indices into ``n``) a data-parallel rank takes: every ``dp``-th one, from
    ``dp_rank`` on (so a group of samples of one prompt is spread over the ranks)."""
    return list(range(dp_rank, n, dp))


def microbatches(indices: Sequence[int], count: int) -> list[list[int]]:
    """``indices`` cut into ``count`` consecutive runs, in order, the first ones one longer when
    they do not divide evenly. Refused when a run would be empty."""
    if count < 1 or len(indices) < count:
        raise ValueError(
            f"{len(indices)} sequences cannot fill {count} microbatches: give at least "
            f"{count} sequences per data-parallel rank or fewer microbatches"
        )
    size, extra = divmod(len(indices), count)
    out, lo = [], 0
    for k in range(count):
        hi = lo + size + (k < extra)
        out.append(list(indices[lo:hi]))
        lo = hi
    return out


def split_batch(n: int, dp: int, dp_rank: int, count: int) -> list[list[int]]:
    """The microbatches (sequence indices) of DP rank ``dp_rank``: its ``dp_share`` of ``n``
    sequences cut into ``count`` runs. A function of its arguments only, so every rank of a TP,
    PP or CP group agrees without talking."""
    return microbatches(dp_share(n, dp, dp_rank), count)
