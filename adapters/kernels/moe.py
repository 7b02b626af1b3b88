"""Mixture-of-experts block: routing, grouping, expert FFNs and the weighted combine, with every
choice a kernel-policy field, so a token's route and output depend on that token alone.

* Router: ``logits_TE = invariant_matmul(x, w_router)`` with operands, tile partials and result
  in ``kp.moe_router_logits_dtype`` (the router weight is replicated on every TP rank).
* Softmax over all experts in ``kp.moe_router_softmax_dtype``: ``max`` (exact), ``exp`` of a row
  padded with ``-inf`` to a whole number of ``_E_PAD`` columns (no row ever straddles a vector
  tail, whose ``exp`` bits can differ from the vector body's), ``fixed_sum``, one divide.
* Top-k: a stable sort by probability, ties to the lowest expert id (or highest:
  ``kp.moe_topk_tie_break``); ``torch.topk`` leaves the order of ties unspecified.
* Weights: the selected probabilities, renormalised (when the checkpoint's ``norm_topk_prob``) as
  ``kp.moe_topk_normalisation`` says, all in the softmax dtype.
* Grouping: the tokens routed to expert ``e`` in ``kp.moe_token_order``; each expert's gate/up
  and down are the dense MLP's own linears (``column_linear``, ``row_partial``), so each row's bits
  are the batch-invariant matmul's, whatever the other rows.
* TP: an expert's FFN is sharded like the dense MLP (gate/up by rows, down by K). The ``[T, k,
  hidden]`` down partials are reduced by the MLP's all-reduce and rounded to the dense dtype
  *before* weighting, exactly as a dense down_proj, so TP=N equals TP=1 bit for bit.
* Combine: a token's k weighted outputs in ``kp.moe_combine_dtype``, a left fold in
  ``kp.moe_combine_order``, rounded once to the dense dtype.
* Expert parallelism (EP > 1: each rank holds ``E / EP`` whole experts, ids in rank order):
  ``ep_gather_tokens`` brings every EP peer's tokens and routes (raw bits, rank order) to each
  rank, which runs its experts on the rows routed to them (each row's bits are the invariant
  matmul's, whatever the other rows); ``ep_combine`` returns the outputs as
  ``kp.moe_ep_combine`` says: ``gather_slots`` moves each (token, slot) output from its
  expert's rank, and the token's rank combines all k as at EP 1 (so EP N equals EP 1 bit for
  bit); ``sum_partials`` sums per-rank partial combines in rank order (megatron's and SGLang's
  reduce of partial sums, which regroups the fold: a fault here).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from ._dtypes import dtype_of
from .all_reduce import all_gather_exact
from .matmul import invariant_matmul, k_runs
from .policy import KernelPolicy
from .reduce import fixed_sum

_E_PAD = 64  # softmax rows padded to a multiple of this many experts


def router_logits(x_TH: torch.Tensor, w_EH: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """``[T, E]`` router logits: the batch-invariant matmul (the contract's K block and tile
    order) with operands, tile partials and result all in ``kp.moe_router_logits_dtype`` (a
    float32 router is float32 through and through, whatever the dense accumulation dtype)."""
    rd = dtype_of(kp.moe_router_logits_dtype)
    router_kp = SimpleNamespace(
        matmul_k_block=kp.matmul_k_block,
        matmul_tile_order=kp.matmul_tile_order,
        matmul_k_runs=k_runs(kp),
        matmul_accumulation_dtype=kp.moe_router_logits_dtype,
    )
    return invariant_matmul(x_TH.to(rd), w_EH.to(rd), router_kp, out_dtype=rd)


def softmax(x_TE: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Row softmax in ``dtype`` with a fixed-order sum; each row's bits depend on that row only."""
    x = x_TE.to(dtype)
    E = x.shape[-1]
    x = F.pad(x, (0, math.ceil(E / _E_PAD) * _E_PAD - E), value=-math.inf)
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return (e / fixed_sum(e)[..., None])[..., :E]


def _lowest_id_first(probs_TE: torch.Tensor) -> torch.Tensor:
    return torch.sort(probs_TE, dim=-1, descending=True, stable=True).indices


def _highest_id_first(probs_TE: torch.Tensor) -> torch.Tensor:
    E = probs_TE.shape[-1]
    return (E - 1) - _lowest_id_first(probs_TE.flip(-1))


TIE_BREAKS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "lowest_expert_id": _lowest_id_first,
    "highest_expert_id": _highest_id_first,
}


def _divide_by_topk_sum(probs_TE, logits_TE, ids_TK, dtype):
    w_TK = probs_TE.gather(-1, ids_TK)
    return w_TK / fixed_sum(w_TK)[..., None]


def _softmax_over_topk_logits(probs_TE, logits_TE, ids_TK, dtype):
    return softmax(logits_TE.gather(-1, ids_TK), dtype)


NORMALISATIONS: dict[str, Callable] = {
    "divide_by_topk_sum": _divide_by_topk_sum,
    "softmax_over_topk_logits": _softmax_over_topk_logits,
}


def _lookup(table: dict, field: str, value: str):
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"unknown {field} {value!r}; known: {sorted(table)}") from None


def route(
    x_TH: torch.Tensor, w_EH: torch.Tensor, kp: KernelPolicy, *, top_k: int, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights_TK, ids_TK)``: each token's ``top_k`` experts, best first (ties as the policy
    says), and their weights in ``kp.moe_router_softmax_dtype``."""
    return select_experts(router_logits(x_TH, w_EH, kp), kp, top_k=top_k, normalize=normalize)


def select_experts(
    logits_TE: torch.Tensor, kp: KernelPolicy, *, top_k: int, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``route`` from the router logits on: softmax, top-k, weights. Split out so a caller that
    computes the logits itself (the trainer's router, whose gradient is megatron's gating
    linear) selects with the same code."""
    sd = dtype_of(kp.moe_router_softmax_dtype)
    probs_TE = softmax(logits_TE, sd)
    order = _lookup(TIE_BREAKS, "moe_topk_tie_break", kp.moe_topk_tie_break)
    ids_TK = order(probs_TE)[..., :top_k]
    if not normalize:
        return probs_TE.gather(-1, ids_TK), ids_TK
    norm = _lookup(NORMALISATIONS, "moe_topk_normalisation", kp.moe_topk_normalisation)
    return norm(probs_TE, logits_TE, ids_TK, sd), ids_TK


def _token_index(tok: torch.Tensor, slot: torch.Tensor):
    return tok, slot  # ``nonzero`` lists (token, slot) pairs in ascending token index


def _unordered(tok: torch.Tensor, slot: torch.Tensor):
    perm = torch.randperm(tok.shape[0], device=tok.device)  # what an atomics-based align gives
    return tok[perm], slot[perm]


TOKEN_ORDERS: dict[str, Callable] = {"token_index": _token_index, "unordered": _unordered}


def group_tokens(
    ids_TK: torch.Tensor, num_experts: int, kp: KernelPolicy
) -> list[tuple[torch.Tensor, ...]]:
    """Per expert ``e``: the ``(token, slot)`` pairs routed to it, in ``kp.moe_token_order``."""
    order = _lookup(TOKEN_ORDERS, "moe_token_order", kp.moe_token_order)
    return [order(*(ids_TK == e).nonzero(as_tuple=True)) for e in range(num_experts)]


def _by_expert_id(ids_TK: torch.Tensor) -> torch.Tensor:
    return torch.sort(ids_TK, dim=-1, stable=True).indices


def _by_topk_rank(ids_TK: torch.Tensor) -> torch.Tensor:
    return torch.arange(ids_TK.shape[-1], device=ids_TK.device).expand_as(ids_TK)


COMBINE_ORDERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "expert_id": _by_expert_id,
    "topk_rank": _by_topk_rank,
}


def combine(
    y_TKH: torch.Tensor,
    weights_TK: torch.Tensor,
    ids_TK: torch.Tensor,
    kp: KernelPolicy,
    shared_TH: torch.Tensor | None = None,
):
    """``sum_k w_k * y_k`` per token in ``kp.moe_combine_dtype``, a left fold over the slots in
    ``kp.moe_combine_order``, rounded once to ``kp.dense_math_dtype``. ``shared_TH``: a shared
    expert's gated output (dense dtype), placed as ``kp.shared_expert_combine`` says
    (``SHARED_COMBINES``)."""
    if shared_TH is None:
        return _fold(y_TKH, weights_TK, ids_TK, kp).to(dtype_of(kp.dense_math_dtype))
    how = _lookup(SHARED_COMBINES, "shared_expert_combine", kp.shared_expert_combine)
    return how(y_TKH, weights_TK, ids_TK, kp, shared_TH)


def _shared_after_routed(y_TKH, weights_TK, ids_TK, kp: KernelPolicy, shared_TH):
    dense = dtype_of(kp.dense_math_dtype)
    return _fold(y_TKH, weights_TK, ids_TK, kp).to(dense) + shared_TH.to(dense)


def _shared_first_in_fold(y_TKH, weights_TK, ids_TK, kp: KernelPolicy, shared_TH):
    dense = dtype_of(kp.dense_math_dtype)
    return _fold(y_TKH, weights_TK, ids_TK, kp, first_TH=shared_TH).to(dense)


SHARED_COMBINES = {
    "after_routed": _shared_after_routed,  # HF's: routed sum rounded, then + shared
    "first_in_fold": _shared_first_in_fold,  # one fold, one rounding
}


def _fold(
    y_TKH,
    weights_TK,
    ids_TK,
    kp: KernelPolicy,
    keep_TK: torch.Tensor | None = None,
    first_TH: torch.Tensor | None = None,
) -> torch.Tensor:
    """The combine's left fold in ``kp.moe_combine_dtype`` (not rounded); ``keep_TK``: only
    those slots (a rank's own experts, for ``sum_partials``), the others skipped; ``first_TH``:
    a term the fold starts from (a shared expert's output)."""
    cd = dtype_of(kp.moe_combine_dtype)
    slots_TK = _lookup(COMBINE_ORDERS, "moe_combine_order", kp.moe_combine_order)(ids_TK)
    rows = torch.arange(ids_TK.shape[0], device=ids_TK.device)
    acc_TH = None if first_TH is None else first_TH.to(cd)
    for j in range(ids_TK.shape[-1]):
        s_T = slots_TK[:, j]
        term = weights_TK[rows, s_T].to(cd)[:, None] * y_TKH[rows, s_T].to(cd)
        if keep_TK is not None:
            keep = keep_TK[rows, s_T][:, None]
            acc_TH = (
                torch.where(keep, term, 0.0)
                if acc_TH is None
                else torch.where(keep, acc_TH + term, acc_TH)
            )
        else:
            acc_TH = term if acc_TH is None else acc_TH + term
    if acc_TH is None:  # k = 0 (no slots): nothing to sum
        acc_TH = y_TKH.new_zeros((ids_TK.shape[0], y_TKH.shape[-1]), dtype=cd)
    return acc_TH


# --- expert parallelism ----------------------------------------------------------------------


def ep_gather_tokens(
    x_TH: torch.Tensor, ids_TK: torch.Tensor, group
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Every EP rank's tokens and routes, concatenated in rank order: ``(x_all, ids_all,
    tokens per rank)``. Moves bits only (ranks may hold different numbers of tokens)."""
    mine = torch.tensor([x_TH.shape[0]], device=x_TH.device)  # NCCL gathers device tensors
    counts = [int(c) for c in all_gather_exact(mine, group)]
    most = max(counts)
    pad = most - x_TH.shape[0]
    xs = all_gather_exact(F.pad(x_TH, (0, 0, 0, pad)), group)
    ids = all_gather_exact(F.pad(ids_TK, (0, 0, 0, pad), value=-1), group)
    x_all = torch.cat([x[:n] for x, n in zip(xs, counts, strict=True)])
    ids_all = torch.cat([i[:n] for i, n in zip(ids, counts, strict=True)])
    return x_all, ids_all, counts


def _gather_slots(
    y_TKH, weights_TK, ids_TK, kp: KernelPolicy, *, group, rank, counts, experts_per_rank
):
    parts = torch.stack(all_gather_exact(y_TKH, group))  # [EP, T_all, k, H]
    lo = sum(counts[:rank])
    mine = slice(lo, lo + counts[rank])
    owner_TK = ids_TK // experts_per_rank
    T = ids_TK.shape[0]
    rows = torch.arange(T, device=ids_TK.device)[:, None].expand_as(ids_TK)
    slots = torch.arange(ids_TK.shape[-1], device=ids_TK.device).expand_as(ids_TK)
    y_mine = parts[:, mine][owner_TK, rows, slots]  # each (token, slot) from its expert's rank
    return combine(y_mine, weights_TK, ids_TK, kp)


def _sum_partials(
    y_TKH, weights_TK, ids_TK, kp: KernelPolicy, *, group, rank, counts, experts_per_rank
):
    # every rank's routes, in the order ep_gather_tokens laid out y_TKH
    w_all, ids_all, _ = ep_gather_tokens(weights_TK, ids_TK, group)
    keep = ids_all // experts_per_rank == rank
    partial = _fold(y_TKH, w_all, ids_all, kp, keep_TK=keep)  # my experts' slots, all tokens
    partials = all_gather_exact(partial, group)
    total = partials[0]
    for p in partials[1:]:
        total = total + p
    lo = sum(counts[:rank])
    return total[lo : lo + counts[rank]].to(dtype_of(kp.dense_math_dtype))


EP_COMBINES: dict[str, Callable] = {"gather_slots": _gather_slots, "sum_partials": _sum_partials}


def ep_combine(
    y_TKH: torch.Tensor,
    weights_TK: torch.Tensor,
    ids_TK: torch.Tensor,
    kp: KernelPolicy,
    *,
    group,
    rank: int,
    counts: Sequence[int],
    experts_per_rank: int,
) -> torch.Tensor:
    """This rank's tokens' combined outputs ``[T_rank, H]`` under EP. ``y_TKH``: ``[T_all, k,
    H]`` over every EP rank's tokens (``ep_gather_tokens``' order), holding this rank's experts'
    outputs (dense dtype) and zeros elsewhere; ``weights_TK``, ``ids_TK``: this rank's tokens'
    routes; ``counts``: tokens per EP rank. How as ``kp.moe_ep_combine`` says."""
    how = _lookup(EP_COMBINES, "moe_ep_combine", kp.moe_ep_combine)
    return how(
        y_TKH, weights_TK, ids_TK, kp,
        group=group, rank=rank, counts=list(counts), experts_per_rank=experts_per_rank,
    )  # fmt: skip


def moe_block(
    x_TH: torch.Tensor,
    w_router_EH: torch.Tensor,
    experts: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    kp: KernelPolicy,
    *,
    top_k: int,
    normalize: bool,
    act: Callable,
    column_linear: Callable,
    row_partial: Callable,
    all_reduce: Callable,
    group=None,
    shared_TH: torch.Tensor | None = None,
) -> torch.Tensor:
    """The MoE MLP of one layer: ``[T, hidden]`` in the dense dtype (before the residual add).
    ``experts[e]`` is expert ``e``'s local ``(gate, up, down)``; the linears, the activation and
    the all-reduce are the dense MLP's. ``shared_TH``: a shared expert's gated output, combined
    as ``kp.shared_expert_combine`` says."""
    T, H = x_TH.shape
    logits_TE = router_logits(x_TH, w_router_EH, kp)  # ``route``, inlined: one hop fewer
    weights_TK, ids_TK = select_experts(logits_TE, kp, top_k=top_k, normalize=normalize)
    acc = dtype_of(kp.matmul_accumulation_dtype)
    partial_TKH = x_TH.new_zeros((T, top_k, H), dtype=acc)
    for (tok, slot), (gate, up, down) in zip(
        group_tokens(ids_TK, len(experts), kp), experts, strict=True
    ):
        if tok.numel() == 0:
            continue
        x_e = x_TH[tok]
        a_e = act(column_linear(x_e, gate, kp), column_linear(x_e, up, kp), kp)
        partial_TKH[tok, slot] = row_partial(a_e, down, kp).to(acc)
    y_TKH = all_reduce(partial_TKH, group).to(dtype_of(kp.dense_math_dtype))
    return combine(y_TKH, weights_TK, ids_TK, kp, shared_TH)
