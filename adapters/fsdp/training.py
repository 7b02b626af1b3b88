"""``--train-steps`` on the FSDP trainer: ``torch.optim.AdamW`` on the FSDP-sharded (DTensor)
parameters, one PPO-clip step per ``TrainBatch``, and a full state dict gathered for the push.

A step on each rank: its ``dp_share`` of the step's sequences (every ``world``-th, the Megatron
trainer's split: ``megatron.data_parallel.split_batch``) packed into one row, a forward with
gradients through the same contract ops as ``runtime.forward_logprobs`` (their bits, autograd
through the stock op: ``ops.straight_through``), the role's loss (``megatron.ppo.ppo_clip``, every
rank dividing by the step's global response-token count), backward. FSDP reduce-scatters each
gradient in ``reduce_dtype`` and averages it; the backward runs on the loss times the world
size, so the result is the sum (exactly, for a power-of-two ``fsdpN``). AdamW steps each rank's
shard (``master_dtype``), and the full state dict
(``get_model_state_dict(full_state_dict=True)``, rank 0) goes to the rollout in ``param_dtype``,
the dtype every forward gathers the parameters in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from ..common.data_parallel import split_batch
from ..common.packing import pack_sequences
from ..common.ppo import ppo_clip
from ..common.run_types import TrainBatch, TrainerRun, TrainInit, TrainStepResult
from ..common.sampling import process_shard
from ..common.shared_tensors import SharedTensors
from ..kernels.logsoftmax import vocab_parallel_token_logprobs
from ..kernels.planted import planted
from . import model as fsdp_model
from .policy import FsdpPolicy
from .runtime import Rank, build_model, hf_inputs


@dataclass
class TrainState:
    """A rank's sharded model, its policies and optimizer, kept across steps."""

    model: torch.nn.Module
    policy: FsdpPolicy
    optimizer: torch.optim.Optimizer
    planted_bugs: tuple[str, ...] = ()


def init_state(job: Any, init: TrainInit, me: Rank) -> TrainState:
    """The sharded model under ``init.fault`` and AdamW on its shards. Data parallelism is the
    FSDP mesh itself: ``microbatches``, the distributed optimizer and ``desync_dp`` are the
    Megatron trainer's and refused here."""
    if init.microbatches != 1 or init.distributed_optimizer or init.desync_dp:
        raise ValueError(
            "the fsdp trainer takes one microbatch per rank, shards the optimizer by FSDP "
            "itself and has no dp.desync_rank fault (got microbatches="
            f"{init.microbatches}, distributed_optimizer={init.distributed_optimizer}, "
            f"desync_dp={init.desync_dp})"
        )
    model, policy = build_model(job, TrainerRun(fault=init.fault), me)
    model.train()
    opt = init.optimizer
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=opt.lr,
        betas=opt.betas,
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        foreach=False,
    )
    return TrainState(model, policy, optimizer, tuple(init.planted_bugs))


def full_weights(state: TrainState, job: Any, me: Rank) -> SharedTensors | None:
    """The full state dict under checkpoint names in ``param_dtype``, on rank 0 (``None`` on
    the others; collective)."""
    full = get_model_state_dict(
        state.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if me.rank != 0:
        return None
    dtype = state.policy.param_dtype
    hf = fsdp_model.to_checkpoint_layout(state.model, full)
    return SharedTensors.pack({k: v.to(dtype) for k, v in hf.items()})


def train_step(state: TrainState, job: Any, batch: TrainBatch, me: Rank) -> TrainStepResult:
    """One PPO-clip step (``TrainBatch``); rank 0's result carries the merged statistics,
    every sequence's logprobs and the pushed weights. The run's planted bugs are on for it."""
    with planted(state.planted_bugs):
        return _train_step(state, job, batch, me)


def _train_step(state: TrainState, job: Any, batch: TrainBatch, me: Rank) -> TrainStepResult:
    n = len(batch.sequences)
    (share,) = split_batch(n, me.world, me.rank, 1)
    total = sum(len(s) - p for s, p in zip(batch.sequences, batch.prompt_lens, strict=True))
    mine = [list(batch.sequences[i]) for i in share] or [[0]]  # a stand-in pairs the collectives
    pack = pack_sequences(mine)
    cu = pack.offsets()
    vocab, kp = job.arch.vocab_size, state.policy.kp
    state.optimizer.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    logits = state.model(**hf_inputs(pack, me.device)).logits[0]  # [T, V]
    new, old, adv, counts = [], [], [], []
    for k, i in enumerate(share):
        lo, hi, p = int(cu[k]), int(cu[k + 1]), batch.prompt_lens[i]
        x, targets = logits[lo : hi - 1], pack.token_ids[lo + 1 : hi].to(me.device)
        if batch.sampling is not None:  # the processed distribution the sampler drew from
            x = process_shard(x, batch.sampling[i], kp, 0, vocab, me.alone)
        lp = vocab_parallel_token_logprobs(x, targets, 0, vocab, kp, me.alone)[p - 1 :]
        new.append(lp)
        old.append(batch.old_logprobs[i].float().to(me.device))
        adv.append(torch.full((lp.numel(),), float(batch.advantages[i]), device=me.device))
        counts.append(lp.numel())
    if share:
        loss, stats = ppo_clip(
            torch.cat(new).float(), torch.cat(old), torch.cat(adv), batch.clip_eps, total
        )
    else:  # no sequence here: a zero loss that still runs the backward's collectives
        loss, stats = logits.sum() * 0.0, torch.zeros(5, device=logits.device)
    # FSDP averages gradients over the ranks; each rank's loss is its share of a global mean,
    # so their sum is wanted: the backward runs on loss x world (a divide factor of 1 would
    # need ReduceOp.PREMUL_SUM, which gloo lacks)
    (loss * me.world).backward()
    t1 = time.perf_counter()
    state.optimizer.step()
    t2 = time.perf_counter()
    out = TrainStepResult()
    mine_lp = {i: lp.detach().cpu() for i, lp in zip(share, new, strict=True)}
    every: list[Any] = [None] * me.world
    dist.all_gather_object(every, (stats.detach().cpu(), mine_lp))
    if me.rank == 0:
        sums, dev = every[0][0][:4].clone(), every[0][0][4:].clone()
        for part, _ in every[1:]:  # rank order: a fixed order, no all-reduce
            sums, dev = sums + part[:4], torch.maximum(dev, part[4:])
        merged = {i: lp for _, part in every for i, lp in part.items()}
        out.logprobs = [merged[i] for i in range(n)]
        out.loss, out.kl, out.loss_if_ratio_one, out.advantage_logprob = (float(v) for v in sums)
        out.ratio_max_abs_dev = float(dev[0])
    t3 = time.perf_counter()
    out.weights = full_weights(state, job, me)
    out.time_s = {
        "forward_backward": t1 - t0,
        "optimizer": t2 - t1,
        "sync": time.perf_counter() - t3,
    }
    return out
