"""LoRA's low-rank path with the contract's numerics: one function both engines call.

A LoRA contract keeps adapters **unmerged**: a target linear's output is
``round_dense(base + s · (x·Aᵀ)·Bᵀ)`` with ``s = alpha / r``, computed as the kernel policy's
``lora_*`` fields say, in this order:

1. ``A`` and ``B`` are pre-rounded to ``lora_adapter_dtype`` (the forward dtype) by the caller;
2. ``t_Mr = x·Aᵀ`` in ``lora_low_rank_dtype`` (``lora_matmul``: the contract's invariant matmul
   or ``torch.matmul``);
3. with ``lora_scale_at == "low_rank_output"``: ``t = round(t · s)`` in ``lora_scale_dtype``;
4. ``d_MN = t·Bᵀ`` produced in ``lora_add_dtype``;
5. with ``lora_scale_at == "delta_output"``: ``d = round(d · s)`` in ``lora_scale_dtype``;
6. ``y = round_dense(base.to(add) + d)`` (``lora_add``).

Tensor parallelism (the same on both sides; chosen so no new reduction order appears):

* column-parallel linears (q/k/v, gate/up): ``A`` replicated, ``B`` split by output rows. ``t``
  is the same on every rank (full K, same kernel), and each rank's ``d`` columns are the TP=1
  result's columns (the invariant matmul is N-invariant), so no communication.
* row-parallel linears (o, down): ``A`` split by input columns, ``B`` replicated. Each rank
  computes its K shard's subtree of ``x·Aᵀ`` in the accumulation dtype, and the contract's
  all-reduce finishes the tree (the base row-parallel linear's own rule, so ``t`` equals TP=1's
  whenever the base linear does); then every rank computes the whole ``d`` and adds it after the
  base linear's all-reduce.

``merged_weight`` is what merged serving computes instead (``W + s·B·A`` rounded to the dense
dtype): not a contract's numerics, kept so fault injection can show the gate sees it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._dtypes import dtype_of
from .all_reduce import all_reduce_for, world_size
from .matmul import invariant_matmul, shard_policy
from .policy import KernelPolicy


def _invariant_mm(
    x: torch.Tensor, w: torch.Tensor, kp: KernelPolicy, out_dtype: torch.dtype
) -> torch.Tensor:
    return invariant_matmul(x, w, kp, out_dtype=out_dtype)


def _stock_mm(
    x: torch.Tensor, w: torch.Tensor, kp: KernelPolicy, out_dtype: torch.dtype
) -> torch.Tensor:
    """``torch.matmul`` in the operands' dtype (its reduction order is the library's)."""
    return torch.matmul(x, w.to(x.dtype).t()).to(out_dtype)


# kernel_policy.lora_matmul -> the matmul of both low-rank products
LORA_MATMULS: dict[str, Callable[..., torch.Tensor]] = {
    "invariant": _invariant_mm,
    "stock": _stock_mm,
}


def lora_scale(alpha: float, rank: int, kp: KernelPolicy) -> torch.Tensor:
    """``alpha / rank`` held in ``lora_scale_dtype`` (a 0-d tensor)."""
    return torch.tensor(alpha / rank, dtype=dtype_of(kp.lora_scale_dtype))


def _scaled(t: torch.Tensor, scale: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """``t · s`` in the scale's dtype, rounded back to ``t``'s."""
    sd = dtype_of(kp.lora_scale_dtype)
    return (t.to(sd) * scale.to(t.device)).to(t.dtype)


def _scale_none(t: torch.Tensor, scale: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    return t


# kernel_policy.lora_scale_at -> (scale applied to t, scale applied to d)
SCALE_AT: dict[str, tuple[Callable, Callable]] = {
    "low_rank_output": (_scaled, _scale_none),
    "delta_output": (_scale_none, _scaled),
}


def low_rank_column(
    x_MK: torch.Tensor, a_rK: torch.Tensor, kp: KernelPolicy, group=None
) -> torch.Tensor:
    """``t = x·Aᵀ`` for a column-parallel linear (``A`` whole on every rank)."""
    mm = LORA_MATMULS[kp.lora_matmul]
    return mm(x_MK, a_rK, kp, dtype_of(kp.lora_low_rank_dtype))


def low_rank_row(
    x_MKlocal: torch.Tensor, a_rKlocal: torch.Tensor, kp: KernelPolicy, group=None
) -> torch.Tensor:
    """``t = x·Aᵀ`` for a row-parallel linear: this rank's K shard's subtree in the accumulation
    dtype, the contract's all-reduce over TP, then one cast (TP=1: the whole tree)."""
    mm = LORA_MATMULS[kp.lora_matmul]
    acc = dtype_of(kp.matmul_accumulation_dtype)
    partial_Mr = mm(x_MKlocal, a_rKlocal, shard_policy(kp, world_size(group)), acc)
    if world_size(group) > 1:
        partial_Mr = all_reduce_for(kp)(partial_Mr, group)
    return partial_Mr.to(dtype_of(kp.lora_low_rank_dtype))


# a linear's TP split (the family's ``Weight.shard``) -> how its low-rank input is made
LOW_RANK_BY_SPLIT: dict[str, Callable[..., torch.Tensor]] = {
    "column": low_rank_column,
    "row": low_rank_row,
}


def lora_delta(
    x: torch.Tensor,
    a_rK: torch.Tensor,
    b_Nr: torch.Tensor,
    scale: torch.Tensor,
    kp: KernelPolicy,
    *,
    split: str,
    group=None,
) -> torch.Tensor:
    """``d = s · (x·Aᵀ)·Bᵀ`` in ``lora_add_dtype`` (``[..., N]``, this rank's output columns)
    for a linear split ``split`` (``column`` / ``row``); ``A``/``B`` already in the adapter
    dtype. Leading dims of ``x`` are kept."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    scale_t, scale_d = SCALE_AT[kp.lora_scale_at]
    t = scale_t(LOW_RANK_BY_SPLIT[split](x2, a_rK, kp, group), scale, kp)
    mm = LORA_MATMULS[kp.lora_matmul]
    d = scale_d(mm(t, b_Nr, kp, dtype_of(kp.lora_add_dtype)), scale, kp)
    return d.reshape(*lead, b_Nr.shape[0])


def lora_add(base: torch.Tensor, delta: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """``round_dense(base + d)``, the add in ``lora_add_dtype``."""
    add = dtype_of(kp.lora_add_dtype)
    return (base.to(add) + delta.to(add)).to(dtype_of(kp.dense_math_dtype))


def merged_delta(a_rK: torch.Tensor, b_Nr: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``s·B·A`` in float32 (``[N, K]``): what merged serving adds to the base weight."""
    return (b_Nr.float() @ a_rK.float()) * scale.float().to(b_Nr.device)


def merged_weight(
    w_NK: torch.Tensor,
    a_rK: torch.Tensor,
    b_Nr: torch.Tensor,
    scale: torch.Tensor,
    kp: KernelPolicy,
) -> torch.Tensor:
    """``W + s·B·A`` in float32, rounded to the dense dtype: merged serving (another numerics;
    fault injection only). Local shards in, local shard out (``B`` rows x ``A`` columns)."""
    return (w_NK.float() + merged_delta(a_rK, b_Nr, scale)).to(dtype_of(kp.dense_math_dtype))
