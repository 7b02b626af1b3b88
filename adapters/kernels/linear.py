"""Tensor-parallel linears built from the invariant matmul and the policy all-reduce."""

from __future__ import annotations

import torch

from ._dtypes import dtype_of
from .all_reduce import all_reduce_for, world_size
from .matmul import invariant_matmul, shard_policy
from .policy import KernelPolicy


def row_parallel_linear(
    x_MKlocal: torch.Tensor, w_NKlocal: torch.Tensor, kp: KernelPolicy, group=None
) -> torch.Tensor:
    """Rank-local subtree ``x_local @ w_local.T`` in the accumulation dtype, then the policy
    all-reduce finishes the tree, then one cast to ``x``'s dtype.

    At TP=1 this is exactly ``invariant_matmul(x, w, kp)``. The rank's K is ``shard_policy``'s
    share of the full K's runs.
    """
    acc = dtype_of(kp.matmul_accumulation_dtype)
    local = shard_policy(kp, world_size(group))
    partial_MN = invariant_matmul(x_MKlocal, w_NKlocal, local, out_dtype=acc)
    return all_reduce_for(kp)(partial_MN, group).to(x_MKlocal.dtype)


def column_parallel_linear(
    x_MK: torch.Tensor, w_NlocalK: torch.Tensor, kp: KernelPolicy
) -> torch.Tensor:
    """Rank-local output columns; bit-identical to the same columns of the full product whenever
    the shard starts at a multiple of ``matmul.N_TILE``."""
    return invariant_matmul(x_MK, w_NlocalK, kp)
