"""Rank side of an RL step on megatron-core: policy-gradient loss, backward, optimizer, weight
gather.

A training session's ranks build their stage once (``init_state``) and keep it, with its
optimizer, across steps. A step (``train_step``) packs the rollout's sequences, runs the forward
with gradients (``pipeline.pipeline_forward_backward``: PP stages hand activations forward and
gradients back), scores every response token with the contract's vocab-parallel log-softmax, the
same kernel and the same bits as the forward-only path, takes a PPO-clip loss against the
rollout's logprobs, finalises the gradients (``grads.finalize_grads``) and steps megatron-core's
mixed-precision optimizer. ``gather_weights`` then rebuilds the HF-named weights from every TP and
PP shard on global rank 0, for the rollout to load.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

from ..common.data_parallel import split_batch
from ..common.packing import pack_sequences
from ..common.ppo import ppo_clip
from ..common.run_types import TrainBatch, TrainerRun, TrainInit, TrainStepResult
from ..common.sampling import process_rows
from ..kernels.logsoftmax import vocab_parallel_token_logprobs
from ..kernels.planted import planted
from .data_parallel import GradBuffer, replica_mismatches, replica_tensors
from .distributed_optimizer import ShardedAdamW
from .gather import gather_weights, tied_embedding_group
from .grads import finalize_grads
from .optimizer import make_optimizer
from .packing import thd_params
from .pipeline import pipeline_forward_backward
from .policy import MegatronPolicy
from .runtime import LOGPROB_VOCAB_BY_APPLY_LOGITS_CONTRACT, build_stage


@dataclass
class TrainState:
    """A rank's stage and optimizer, kept across steps."""

    model: Any
    config: Any
    padded_vocab: int
    policy: MegatronPolicy
    """The stage's policies (``build_stage``: resolved once with the config)."""
    optimizer: Any
    """megatron-core's mixed-precision optimizer (``make_optimizer``) or, with the distributed
    optimizer, ``ShardedAdamW``."""
    planted_bugs: tuple[str, ...] = ()
    """``TrainInit.planted_bugs``: switched on for every step (``kernels.planted``)."""
    microbatches: int = 1
    """Microbatches per step per DP rank (``TrainInit.microbatches``)."""
    grads: GradBuffer | None = None
    """The fp32 gradient buffer (``data_parallel``) under DP or several microbatches; None:
    gradients stay in ``.grad`` (one microbatch, no DP)."""
    desync_dp: bool = False
    """``TrainInit.desync_dp``: the last DP rank keeps its own gradient, or under the
    distributed optimizer its own parameters (a fault)."""
    distributed: bool = False
    """``TrainInit.distributed_optimizer``: ``optimizer`` is a ``ShardedAdamW``."""
    lora: torch.nn.ModuleList | None = None
    """The stage's LoRA branches when the weights carry an adapter: then they are all that
    trains (the base is frozen: ``requires_grad`` off, no gradient, no optimizer state) and all
    that a step pushes (``gather_push``). None: the whole model trains."""

    @property
    def trainable(self) -> torch.nn.Module:
        """The module whose parameters the optimizer, the gradient buffer and the DP replica
        check hold: the LoRA branches, or the model."""
        return self.model if self.lora is None else self.lora


def init_state(job: Any, init: TrainInit) -> TrainState:
    if job.layout.ep > 1:
        raise ValueError(
            f"layout {job.layout.name}: expert parallelism runs the forward only (the token "
            "exchange has no backward, and the weight gather assumes every expert on a rank); "
            "train at EP 1"
        )
    model, config, padded, policy = build_stage(job, TrainerRun(fault=init.fault))
    model.train()
    lora = None
    if model.lora_branches:  # LoRA: only A and B train; the base is frozen
        for p in model.parameters():
            p.requires_grad_(False)
        lora = torch.nn.ModuleList(model.lora_branches)
    trainable = model if lora is None else lora
    dp = ps.get_data_parallel_world_size()
    grads = (
        GradBuffer(trainable)
        if dp > 1 or init.microbatches > 1 or init.distributed_optimizer
        else None
    )
    if init.distributed_optimizer:
        optimizer: Any = ShardedAdamW(
            trainable, grads, init.optimizer, ps.get_data_parallel_group()
        )
    else:
        optimizer = make_optimizer(trainable, init.optimizer, job.device)
    return TrainState(
        model,
        config,
        padded,
        policy,
        optimizer,
        tuple(init.planted_bugs),
        init.microbatches,
        grads,
        init.desync_dp,
        init.distributed_optimizer,
        lora,
    )


def trained_counts(state: TrainState) -> dict[str, int]:
    """``TrainStepResult.trained``: this stage's trainable and frozen parameter elements."""
    every = [*state.model.parameters(), *(state.lora.parameters() if state.lora else ())]
    return {
        "trainable": sum(p.numel() for p in every if p.requires_grad),
        "frozen": sum(p.numel() for p in every if not p.requires_grad),
    }


@dataclass
class _Scored:
    """The response tokens of a packed batch: row of the logit that scores each, its target."""

    rows: torch.Tensor
    targets: torch.Tensor
    old: torch.Tensor
    advantages: torch.Tensor
    counts: list[int]
    seq: torch.Tensor
    """The sequence each row scores (non-decreasing)."""


def _scored(pack: Any, batch: TrainBatch) -> _Scored:
    rows, targets, old, adv, counts = [], [], [], [], []
    for path, p, lp, a in zip(
        pack.paths, batch.prompt_lens, batch.old_logprobs, batch.advantages, strict=False
    ):
        r = path[p - 1 : -1]
        if lp.numel() != r.numel():
            raise ValueError(
                f"old logprobs for {lp.numel()} tokens, sequence has {r.numel()} response tokens"
            )
        rows.append(r)
        targets.append(pack.token_ids[path[p:]])
        old.append(lp.float())
        adv.append(torch.full((r.numel(),), float(a)))
        counts.append(r.numel())
    seq = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    return _Scored(torch.cat(rows), torch.cat(targets), torch.cat(old), torch.cat(adv), counts, seq)


def _merge_cp(values: torch.Tensor, owned: torch.Tensor, group: Any) -> torch.Tensor:
    """Each CP rank holds ``values`` at the positions it ``owned``: everyone's, merged (exact:
    selection only)."""
    n = dist.get_world_size(group)
    if n == 1:
        return values
    vals = [torch.empty_like(values) for _ in range(n)]
    owns = [torch.empty_like(owned) for _ in range(n)]
    dist.all_gather(vals, values, group=group)
    dist.all_gather(owns, owned, group=group)
    out = vals[0]
    for v, o in zip(vals[1:], owns[1:], strict=True):
        out = torch.where(o, v, out)
    return out


def train_step(state: TrainState, job: Any, batch: TrainBatch) -> TrainStepResult:
    """One PPO-clip step (see ``TrainBatch``); every rank returns its part of the result. The
    run's planted bugs (the gate's self-test) are on for the whole step."""
    with planted(state.planted_bugs):
        return _train_step(state, job, batch)


def _sync_clock(device: str) -> float:
    """``time.perf_counter()`` once the device's queued work is done."""
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def _sub_batch(batch: TrainBatch, indices: list[int]) -> TrainBatch:
    """The sequences ``indices`` of ``batch`` (a microbatch), with their own logprobs,
    advantages and sampling params."""

    def pick(values: Any) -> Any:
        return None if values is None else tuple(values[i] for i in indices)

    return dataclasses.replace(
        batch,
        sequences=pick(batch.sequences),
        prompt_lens=pick(batch.prompt_lens),
        old_logprobs=pick(batch.old_logprobs),
        advantages=pick(batch.advantages),
        sampling=pick(batch.sampling),
    )


def _train_step(state: TrainState, job: Any, batch: TrainBatch) -> TrainStepResult:
    """One step over ``state.microbatches`` microbatches of this DP rank's share of the batch
    (``data_parallel.split_batch``). Each microbatch: forward, loss (over the step's global
    response-token count), backward, ``grads.finalize_grads`` over CP/TP/tied embedding. With
    one microbatch and no DP (``state.grads`` None) the gradient stays in ``.grad``; else each
    microbatch's is added into the fp32 ``GradBuffer`` and summed over DP in the fixed tree
    order after the last. Then the optimizer step, the DP replicas' bits compared, and the
    weights gathered for the push."""
    device = job.device
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    parts = split_batch(len(batch.sequences), dp, dp_rank, state.microbatches)
    total = sum(len(s) - p for s, p in zip(batch.sequences, batch.prompt_lens, strict=True))
    state.optimizer.zero_grad()
    if state.grads is not None:
        state.grads.zero()
    t0 = _sync_clock(device)
    scored: list[tuple[list[int], _MicrobatchResult | None]] = []
    for indices in parts:
        res = _microbatch(state, job, _sub_batch(batch, indices), total)
        scored.append((indices, res))
        if state.grads is not None:
            state.grads.accumulate()
    t1 = _sync_clock(device)
    fault = state.desync_dp and dp > 1 and dp_rank == dp - 1
    if state.distributed:  # reduce-scatter, shard step, all-gather (``ShardedAdamW``)
        state.optimizer.step(skip_gather=fault)
    else:
        if state.grads is not None:
            state.grads.reduce(ps.get_data_parallel_group(), skip=fault)
        else:
            for p in state.trainable.parameters():  # fp32: megatron's optimizer reads main_grad
                if p.dtype == torch.float32 and p.grad is not None:
                    p.main_grad = p.grad
        state.optimizer.step()
    t2 = _sync_clock(device)
    out = TrainStepResult()
    if scored[0][1] is not None:  # the last pipeline stage
        _report(out, scored, len(batch.sequences), dp)
    if dp > 1:  # every replica's parameters and fp32 main copies, bit for bit, every step
        mismatched = replica_mismatches(
            replica_tensors(state.trainable), ps.get_data_parallel_group()
        )
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, mismatched)
        if dist.get_rank() == 0:
            out.replica_mismatches = sorted({n for names in every for n in names})
    t3 = _sync_clock(device)
    out.weights = gather_weights(state, job, adapter_only=state.lora is not None)
    out.time_s = {
        "forward_backward": t1 - t0,
        "optimizer": t2 - t1,
        "sync": _sync_clock(device) - t3,
    }
    if device == "cuda":  # the rollout shares the GPU: the step's freed activations go back
        torch.cuda.empty_cache()
    return out


@dataclass
class _MicrobatchResult:
    """A microbatch's part of the step, on the last stage: each sequence's logprobs (TP-0, CP-0
    rank only, else None), the four summed statistics and the ratio's deviation (CP-merged)."""

    logprobs: list[torch.Tensor] | None
    sums: torch.Tensor
    dev: torch.Tensor


def _report(out: TrainStepResult, scored: list, n: int, dp: int) -> None:
    """Fill ``out`` on the last stage: microbatches summed in order, then DP ranks in rank order
    (a fixed order: no all-reduce), logprobs put back in sequence order on DP rank 0."""
    sums = scored[0][1].sums.clone()
    dev = scored[0][1].dev.clone()
    for _, res in scored[1:]:
        sums, dev = sums + res.sums, torch.maximum(dev, res.dev)
    mine = {
        i: lp
        for indices, res in scored
        if res.logprobs is not None
        for i, lp in zip(indices, res.logprobs, strict=True)
    }
    if dp > 1:
        group = ps.get_data_parallel_group()
        parts = [torch.empty_like(sums) for _ in range(dp)]
        dist.all_gather(parts, sums, group=group)
        sums = parts[0]
        for part in parts[1:]:
            sums = sums + part
        dist.all_reduce(dev, op=dist.ReduceOp.MAX, group=group)
        every: list[Any] = [None] * dp
        dist.all_gather_object(every, mine, group=group)
        mine = {i: lp for part in every for i, lp in part.items()}
    if ps.get_tensor_model_parallel_rank() == 0 and ps.get_context_parallel_rank() == 0:
        if ps.get_data_parallel_rank() == 0:
            out.logprobs = [mine[i] for i in range(n)]
            out.loss, out.kl, out.loss_if_ratio_one, out.advantage_logprob = (
                float(v) for v in sums
            )
            out.ratio_max_abs_dev = float(dev[0])


def _microbatch(
    state: TrainState, job: Any, batch: TrainBatch, total: int
) -> _MicrobatchResult | None:
    """Forward, loss and backward of one microbatch (``batch``), its loss a share of the step's
    ``total`` response tokens; gradients finalised over CP/TP/tied embedding (DP is the
    ``GradBuffer``'s, or ``finalize_grads``' without one). ``None`` off the last stage."""
    model, config, device = state.model, state.config, job.device
    policy, kp = state.policy.rp, state.policy.kp
    cp, cp_rank = job.layout.cp, ps.get_context_parallel_rank()
    cp_group, tp_group = ps.get_context_parallel_group(), ps.get_tensor_model_parallel_group()
    pack = pack_sequences([list(s) for s in batch.sequences], pad_to_multiple=cp)
    scored = _scored(pack, batch)
    local = pack.token_ids.numel() // cp
    lo = cp_rank * local
    owned = (scored.rows >= lo) & (scored.rows < lo + local)
    mine = owned.nonzero()[:, 0]  # host tensors: no device sync
    # The step's inputs go to the device before the forward is queued: a copy from pageable
    # memory waits for the stream, so the loss's, made inside ``loss_fn``, waited for the whole
    # forward (four waits between forward and backward; now none until the step's result).
    rows_d, targets_d, old_d, adv_d = (
        t.to(device)
        for t in (
            scored.rows[mine] - lo,
            scored.targets[mine],
            scored.old[mine],
            scored.advantages[mine],
        )
    )
    input_ids = pack.token_ids[lo : lo + local][None].to(device)
    position_ids = pack.positions[lo : lo + local][None].to(device)
    params = thd_params(pack).to(device)

    def loss_fn(out: torch.Tensor) -> tuple[torch.Tensor, Any]:
        logits = out[0]  # [T/cp, V/tp]
        vocab = LOGPROB_VOCAB_BY_APPLY_LOGITS_CONTRACT[bool(policy.apply_logits_contract)](
            config.true_on_policy_vocab_size, state.padded_vocab
        )
        vocab_start = ps.get_tensor_model_parallel_rank() * logits.shape[-1]
        x = logits[rows_d]
        if batch.sampling is not None:  # the processed distribution the sampler drew from
            x = process_rows(x, scored.seq[mine], batch.sampling, kp, vocab_start, vocab, tp_group)
        lp = vocab_parallel_token_logprobs(x, targets_d, vocab_start, vocab, kp, tp_group)
        loss, stats = ppo_clip(lp.float(), old_d, adv_d, batch.clip_eps, total)
        return loss, (lp.detach(), stats)

    result = pipeline_forward_backward(
        model,
        loss_fn,
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=None,
        packed_seq_params=params,
    )
    buffered = state.grads is not None
    finalize_grads(
        state.trainable,
        policy,
        group=cp_group if buffered else ps.get_data_parallel_group(with_context_parallel=True),
        dp=1 if buffered else ps.get_data_parallel_world_size(),
        cp=cp,
        tp_group=tp_group,
        embedding_group=tied_embedding_group(job),
    )
    if result is None:
        return None
    lp_local, stats = result
    values = torch.zeros(scored.rows.numel(), dtype=lp_local.dtype, device=lp_local.device)
    values[mine.to(values.device)] = lp_local
    logprobs = _merge_cp(values, owned.to(values.device), cp_group).cpu()
    sums = stats[:4].clone()  # loss, kl, loss at ratio 1, A·logp: each rank's share
    dev = stats[4:].clone()
    if cp > 1:  # summed in rank order, the same for all four (no all-reduce order)
        parts = [torch.empty_like(sums) for _ in range(cp)]
        dist.all_gather(parts, sums, group=cp_group)
        sums = parts[0]
        for part in parts[1:]:
            sums = sums + part
        dist.all_reduce(dev, op=dist.ReduceOp.MAX, group=cp_group)
    first = ps.get_tensor_model_parallel_rank() == 0 and cp_rank == 0
    per_seq = list(torch.split(logprobs, scored.counts)) if first else None
    return _MicrobatchResult(per_seq, sums, dev)
