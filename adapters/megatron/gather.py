"""Gathers of the trainer's stage tensors under HF names: the weights a training step pushes
(``gather_weights``), every parameter's value or gradient on global rank 0 (``gather_hf``,
``gather_stages``), and the tied-embedding group of a PP split. Collective calls over
megatron-core's groups; ``runtime`` (the gradient check) and ``training`` (the step) both use
them, so neither imports the other."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

from ..common.shared_tensors import SharedTensors
from .checkpoint import hf_state_from_stage
from .lora import gather_adapter


def _gather_tp(param: torch.Tensor, t: torch.Tensor, group: Any) -> torch.Tensor:
    """``t`` (``param``'s value or gradient) concatenated over the TP group along ``param``'s
    partition dim when ``param`` is TP-sharded."""
    n = dist.get_world_size(group)
    if n == 1 or not getattr(param, "tensor_model_parallel", False):
        return t
    parts = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim=param.partition_dim)


def gather_weights(state: Any, job: Any, adapter_only: bool = False) -> SharedTensors | None:
    """This rank's part of the HF-named weights, in one shared-memory buffer: its stage's, every
    TP shard concatenated, on the stage's TP-0, CP-0, DP-0 rank (``None`` on the others;
    collective within the TP group), with the LoRA adapter as the forward uses it when the stage
    has one (``lora.gather_adapter``). The parent takes the parts from the ranks' replies and
    merges them in rank order (``TrainerSession.train``): no pickled state dict, no gather to
    rank 0, and each tensor copied once, from the device into the buffer the rollout reads.
    ``adapter_only``: the adapter alone (a LoRA step's push; the base is frozen)."""
    tp_group = ps.get_tensor_model_parallel_group()
    model = state.model
    adapter = gather_adapter(list(state.lora or ()), tp_group)
    full = (
        {}
        if adapter_only
        else {n: _gather_tp(p, p.detach(), tp_group) for n, p in model.named_parameters()}
    )
    if (
        ps.get_tensor_model_parallel_rank() != 0
        or ps.get_context_parallel_rank() != 0
        or ps.get_data_parallel_rank() != 0
    ):
        return None
    if adapter_only:
        return SharedTensors.pack(adapter)
    layers = getattr(model.decoder, "layers", [])
    numbers = {local: layer.layer_number - 1 for local, layer in enumerate(layers)}
    base = hf_state_from_stage(full, job.arch, numbers, tp_size=job.layout.tp)
    return SharedTensors.pack({**base, **adapter})


def gather_hf(
    model: Any, job: Any, value: Callable[[torch.Tensor], torch.Tensor]
) -> dict[str, torch.Tensor] | None:
    """``value(param)`` of every parameter (the weight, or its gradient) under HF names, for the
    whole model, on global rank 0 (``None`` on other ranks): TP shards concatenated within each
    stage, then every stage's tensors sent to rank 0. Collective: every rank calls it. A tied head
    split over PP stages is taken from the first stage's embedding."""
    tp_group = ps.get_tensor_model_parallel_group()
    full = {n: _gather_tp(p, value(p), tp_group) for n, p in model.named_parameters()}
    layers = getattr(model.decoder, "layers", [])
    numbers = {local: layer.layer_number - 1 for local, layer in enumerate(layers)}
    return gather_stages(hf_state_from_stage(full, job.arch, numbers, tp_size=job.layout.tp))


def gather_stages(stage: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """Each stage's HF-named tensors ``stage`` (whole over TP) merged on global rank 0 (``None``
    on the others), taken from each stage's TP-0, CP-0 ranks. Collective: every rank calls it."""
    mine = None
    if ps.get_tensor_model_parallel_rank() == 0 and ps.get_context_parallel_rank() == 0:
        mine = {k: v.cpu() for k, v in stage.items()}
    stages: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, stages, dst=0)
    if stages is None:
        return None
    out: dict[str, torch.Tensor] = {}
    for part in stages:
        for name, value in (part or {}).items():
            out.setdefault(name, value)
    return out


def tied_embedding_group(job: Any) -> Any:
    """The embedding group when a tied LM head is split over PP stages (the first stage's
    embedding and the last stage's copy): their gradients must be summed, as megatron-core's
    ``_allreduce_word_embedding_grads`` does. ``None`` otherwise."""
    if not job.arch.tie_word_embeddings or job.layout.pp == 1:
        return None
    return ps.get_embedding_group() if ps.is_rank_in_embedding_group() else None
