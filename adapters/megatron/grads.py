"""Gradient finalisation under Ulysses context parallelism.

Each CP rank's loss covers only its own token shard, so the full-sequence gradient is the *sum*
over CP ranks. ``defer_ulysses_cp_loss_scaling_to_grad_sum`` (public fork: DDP's gradient
scaling) scales the DP×CP gradient sum by ``cp / dp_cp`` (= ``1 / dp``: CP ranks add up to one
sample) instead of megatron's default ``1 / dp_cp`` (which would also average over CP and so
shrink the gradient by ``cp``). With CP=1 both are ``1 / dp``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

GRAD_SCALE_BY_DEFER_ULYSSES_CP_LOSS_SCALING: dict[bool, Callable[[int, int], float]] = {
    True: lambda dp, cp: cp / (dp * cp),
    False: lambda dp, cp: 1.0 / (dp * cp),
}


def grad_scale(policy: Any, *, dp: int, cp: int) -> float:
    """The factor applied to gradients summed over the DP×CP group."""
    return GRAD_SCALE_BY_DEFER_ULYSSES_CP_LOSS_SCALING[
        bool(policy.defer_ulysses_cp_loss_scaling_to_grad_sum)
    ](dp, cp)


# Parameters replicated over TP whose gradient each rank only sees a share of (the heads it
# holds): QK-norm weights (megatron's own rule) and the Gated DeltaNet output norm.
TP_PARTIAL_GRAD_NAMES = ("q_layernorm", "k_layernorm", "self_attention.out_norm")

# The two copies of a tied LM head when PP splits it: first stage, last stage.
TIED_EMBEDDING_PARAMS = ("embedding.word_embeddings.weight", "output_layer.weight")


def finalize_grads(
    model: torch.nn.Module,
    policy: Any,
    *,
    group: Any,
    dp: int,
    cp: int,
    tp_group: Any = None,
    embedding_group: Any = None,
) -> None:
    """What megatron-core's DDP + ``finalize_model_grads`` do, on plain ``.grad`` (CPU):
    sum over ``group`` (DP×CP) scaled by ``grad_scale``; as megatron's
    ``_allreduce_non_tensor_model_parallel_grads`` does, sum the QK-norm weight gradients over TP
    (each TP rank only sees its own heads; likewise the Gated DeltaNet output norm's); and, with ``embedding_group`` (a tied LM head split
    over PP stages), sum the embedding's and the head copy's gradients over that group, as
    ``_allreduce_word_embedding_grads`` does. Training-path reductions, not scored ones."""
    scale = grad_scale(policy, dp=dp, cp=cp)
    _zero_grads_missing_here(model, group)
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if dist.get_world_size(group) > 1:
            dist.all_reduce(p.grad, group=group)
        p.grad.mul_(scale)
        if tp_group is not None and any(part in name for part in TP_PARTIAL_GRAD_NAMES):
            if dist.get_world_size(tp_group) > 1:
                dist.all_reduce(p.grad, group=tp_group)
        if embedding_group is not None and name in TIED_EMBEDDING_PARAMS:
            dist.all_reduce(p.grad, group=embedding_group)


def _zero_grads_missing_here(model: torch.nn.Module, group: Any) -> None:
    """Give a zero gradient to every parameter that has none on this rank but has one on another
    rank of ``group``, so that every rank joins the same all-reduces in ``finalize_grads``. Under
    context parallelism a routed expert that none of this rank's tokens reached has no gradient
    here while another CP rank's tokens did reach it (its contribution here is exactly zero).
    A parameter without a gradient on every rank (or any parameter of a dense model, whose ranks
    all agree) is left as it is."""
    if dist.get_world_size(group) == 1:
        return
    params = list(model.parameters())
    here = torch.tensor(
        [p.grad is not None for p in params], dtype=torch.int32, device=params[0].device
    )
    anywhere = here.clone()
    dist.all_reduce(anywhere, op=dist.ReduceOp.MAX, group=group)
    for p, mine, any_rank in zip(params, here.tolist(), anywhere.tolist(), strict=True):
        if any_rank and not mine:
            p.grad = torch.zeros_like(p)
