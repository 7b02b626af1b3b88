"""Per-rank pieces of the FSDP trainer: process group and mesh, the sharded model, the forward
logprobs of this rank's share of the sequences.

FSDP is data parallel with sharded parameters: every rank runs the whole model (FSDP2 gathers
each unit's parameters before its forward) on its own sequences, ``dp_share`` of them, packed
into one row. Every rank runs every forward, a rank without sequences of its own a one-token
stand-in, so the units' all-gathers pair up. Nothing is summed across ranks on the scored path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ..common.data_parallel import dp_share
from ..common.distributed import start_process_group
from ..common.packing import Pack, pack_sequences
from ..common.run_types import TrainerResult
from ..common.sampling import process_shard
from ..kernels.logsoftmax import vocab_parallel_token_logprobs
from . import model as fsdp_model
from .policy import FsdpPolicy, resolve


@dataclass
class Rank:
    """This process's place: its rank, the world, the FSDP mesh and a group of itself alone
    (where the kernels' cross-rank reductions run: a tree of one)."""

    rank: int
    world: int
    mesh: Any
    alone: Any
    device: str


def init_distributed(rank: int, world: int, port: int, device: str) -> Rank:
    """The process group (``common.distributed``: joined at the session's rendezvous on
    ``port``), the 1-D FSDP mesh over every rank, and one group per rank of that rank alone."""
    start_process_group(rank, world, port, device)
    mesh = init_device_mesh(device, (world,), mesh_dim_names=("fsdp",))
    groups = [dist.new_group([r]) for r in range(world)]  # every rank creates every group
    return Rank(rank, world, mesh, groups[rank], device)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def hf_inputs(pack: Pack, device: str) -> dict[str, Any]:
    """What the HF model's forward takes for a flat ``pack`` (``common.packing``): one packed
    row, its positions, and the varlen kwargs transformers hands through to the attention
    function."""
    cu = pack.offsets()
    lengths = cu[1:] - cu[:-1]
    return {
        "input_ids": pack.token_ids[None].to(device),
        "position_ids": pack.positions[None].to(device),
        "cu_seq_lens_q": cu.to(device),
        "cu_seq_lens_k": cu.to(device),
        "max_length_q": int(lengths.max()),
        "max_length_k": int(lengths.max()),
        "use_cache": False,
    }


def build_model(job: Any, run: Any, me: Rank) -> tuple[torch.nn.Module, FsdpPolicy]:
    """This rank's sharded model under ``run``'s policies (built afresh per run, so runs never
    leak into each other)."""
    policy = resolve(job.contract_id, run)
    model = fsdp_model.build(job.arch, job.weights, policy, me.alone).to(me.device)
    return fsdp_model.shard(model, policy, me.mesh), policy


def forward_logprobs(job: Any, run: Any, me: Rank) -> tuple[TrainerResult | None, Any]:
    """Forward on this rank: ``(TrainerResult with this rank's sequences' logprobs and None
    for the others, layer dumps or None)``. A dumping run (first-divergence reports) has every
    rank score every sequence and only rank 0 answer."""
    model, policy = build_model(job, run, me)
    model.eval()
    n = len(job.sequences)
    whole = me.world == 1 or run.dump_layers
    share = list(range(n)) if whole else dp_share(n, me.world, me.rank)
    mine = [job.sequences[i] for i in share] or [[0]]  # a stand-in keeps the all-gathers paired
    pack = pack_sequences(mine)
    cu = pack.offsets()
    dumps: dict[str, torch.Tensor] = {}
    hooks = []
    if run.dump_layers:
        for i, layer in enumerate(model.model.layers):

            def record(_m, _a, out, name=f"layer.{i}") -> None:
                dumps[name] = (out[0] if isinstance(out, tuple) else out)[0].detach().cpu()

            hooks.append(layer.register_forward_hook(record))
    with torch.no_grad():
        logits = model(**hf_inputs(pack, me.device)).logits[0]  # [T, V]
    for h in hooks:
        h.remove()
    if not share:
        return None, None
    vocab, kp = job.arch.vocab_size, policy.kp
    logprobs: list[Any] = [None] * n
    for k, i in enumerate(share):
        lo, hi = int(cu[k]), int(cu[k + 1])
        x, targets = logits[lo : hi - 1], pack.token_ids[lo + 1 : hi].to(me.device)
        if run.sampling is not None:  # the processed distribution the sampler drew from
            x = process_shard(x, run.sampling[i], kp, 0, vocab, me.alone)
        logprobs[i] = vocab_parallel_token_logprobs(x, targets, 0, vocab, kp, me.alone).cpu()
    per_seq = None
    if run.dump_layers:
        per_seq = [
            {k: v[int(cu[j]) : int(cu[j + 1])] for k, v in dumps.items()} for j in range(len(share))
        ]
    if whole and me.rank != 0:
        return None, None
    return TrainerResult(logprobs=logprobs), per_seq


def backward_grads(job: Any, run: Any, me: Rank) -> TrainerResult | None:
    """One backward (``TrainerRun.grads``): the loss is minus the sum of each rank's response
    tokens' logprobs (``run.prompt_lens``; every token after the first without them), through
    the same contract ops as the forward, on the rank's ``dp_share`` of the sequences. FSDP
    reduce-scatters and averages the gradients, so the backward runs on loss x world (their sum);
    each full gradient is all-gathered (``DTensor.full_tensor``, every rank in one order) and
    rank 0 answers with them under checkpoint names (``hf_grads``)."""
    model, policy = build_model(job, run, me)
    model.train()
    n = len(job.sequences)
    share = dp_share(n, me.world, me.rank)
    mine = [job.sequences[i] for i in share] or [[0]]  # a stand-in keeps the collectives paired
    pack = pack_sequences(mine)
    cu = pack.offsets()
    starts = run.prompt_lens or (1,) * n
    logits = model(**hf_inputs(pack, me.device)).logits[0]  # [T, V]
    loss = logits.sum() * 0.0  # a rank with no sequence still runs the backward's collectives
    for k, i in enumerate(share):
        lo, hi = int(cu[k]), int(cu[k + 1])
        x, targets = logits[lo : hi - 1], pack.token_ids[lo + 1 : hi].to(me.device)
        lp = vocab_parallel_token_logprobs(x, targets, 0, job.arch.vocab_size, policy.kp, me.alone)
        loss = loss - lp[starts[i] - 1 :].float().sum()
    (loss * me.world).backward()
    full = {}
    for name, p in model.named_parameters():
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        full[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().cpu()
    if me.rank != 0:
        return None
    return TrainerResult(logprobs=[], hf_grads=fsdp_model.to_checkpoint_layout(model, full))
