"""The trainer role's data types, one definition for every trainer target: what the gate builds
(``TrainerRun``, ``TrainerFault``, ``TrainInit``, ``TrainBatch``, ``OptimizerSettings``) and what a
session answers (``TrainerResult``, ``TrainStepResult``), plus the fault helper. A target's parent
process (its session) and its ranks both import this, not each other. Each target's README says how
it implements a setting (``OptimizerSettings`` is mixed-precision AdamW wherever it runs)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

# device -> torch.distributed backend of the spawned processes.
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


@dataclass(frozen=True)
class TrainerFault:
    """Fields to flip on the trainer side only (``dataclasses.replace`` on the policies)."""

    runtime_policy: Mapping[str, Any] = field(default_factory=dict)
    kernel_policy: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class TrainerResult:
    """Per-sequence logprobs: ``logprobs[i][j] = log p(seq_i[j + 1] | seq_i[: j + 1])``."""

    logprobs: list[torch.Tensor]
    layer_dumps: list[dict[str, torch.Tensor]] | None = None
    """Per sequence: ``{"layer.<i>": [len, hidden]}``, the residual stream after layer ``i``
    (output + residual), comparable with the rollout's ``layer_outputs``."""
    grads: dict[str, torch.Tensor] | None = None
    """Global rank 0's parameter gradients (the target's own names: first stage, TP/CP rank 0)."""
    hf_grads: dict[str, torch.Tensor] | None = None
    """Every parameter's gradient, gathered from every TP shard and PP stage, under HF names."""
    kernel_calls: Any = None
    """With ``TrainerRun.kernel_audit``: every rank's ``kernels.audit.KernelCalls``, merged."""


@dataclass(frozen=True)
class TrainerRun:
    """One forward variant; several share one set of spawned processes (``trainer_logprobs_runs``)."""

    dtype_override: str | None = None
    fault: TrainerFault | None = None
    prefix_tree: bool = False
    prompt_lens: tuple[int, ...] | None = None
    dump_layers: bool = False
    grads: bool = False
    """Training step instead: loss = summed next-token cross-entropy (vocab-parallel)
    of each rank's tokens (with ``prompt_lens``: response
    tokens only), backward through every stage, ``grads.finalize_grads``; the result's ``grads``
    and ``hf_grads`` hold the gradients (see ``TrainerResult``)."""
    kernel_audit: str | None = None
    """``"count"`` / ``"strict"``: every rank records its contract-kernel calls (and stock ops)
    for ``TrainerResult.kernel_calls`` (``kernels.audit``); None: nothing recorded."""
    planted_bugs: tuple[str, ...] = ()
    """Shared-kernel bugs switched on for this run (``kernels.planted``: the parity gate's
    self-test; the rollout side gets the same ones)."""
    sampling: tuple[Any, ...] | None = None
    """Per sequence, the ``common.sampling.SamplingParams`` its tokens were drawn with: its
    logprobs are of that processed distribution (temperature, top-k, top-p), as the sampler's.
    None: of the logits (temperature 1). The forward only (not ``grads``)."""


def with_fault(policy: Any, changes: Mapping[str, Any]) -> Any:
    """``dataclasses.replace`` with a clear error for a misspelt field."""
    names = {f.name for f in dataclasses.fields(policy)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise ValueError(
            f"{type(policy).__name__} has no field(s) {unknown}; fields: {sorted(names)}"
        )
    return dataclasses.replace(policy, **changes)


@dataclass(frozen=True)
class OptimizerSettings:
    """The trainer's optimizer: bf16 mixed precision (fp32 main parameters) around
    ``torch.optim.AdamW`` (what a model-parallel trainer falls back to without Apex or Transformer
    Engine; an FSDP trainer's AdamW on its sharded parameters)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip_grad: float = 0.0
    """Gradient-norm clipping; 0 = off (the model-parallel trainer's library clipping allocates on
    CUDA, so CPU runs cannot use it)."""


@dataclass(frozen=True)
class TrainInit:
    """Build the stage and its optimizer once, kept across steps (the ranks' training state)."""

    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    fault: TrainerFault | None = None
    """Flipped on the trainer side for the whole run (training fault injection)."""
    planted_bugs: tuple[str, ...] = ()
    """Shared-kernel bugs switched on in every training step (``kernels.planted``: the gate's
    self-test; the rollout gets the same ones)."""
    microbatches: int = 1
    """Microbatches per step on each data-parallel rank (gradient accumulation: each one's
    gradient added into an fp32 buffer in order; ``data_parallel``)."""
    distributed_optimizer: bool = False
    """Shard the optimizer state over the data-parallel ranks (``distributed_optimizer.
    ShardedAdamW``: reduce-scatter, AdamW on this rank's fp32 shard, all-gather) instead of
    the mixed-precision optimizer on every rank."""
    desync_dp: bool = False
    """Fault: the last data-parallel rank skips the gradient reduction and steps on its own
    gradient (with the distributed optimizer: skips taking the all-gathered parameters), so its
    replica drifts (``TrainStepResult.replica_mismatches`` must name it)."""


@dataclass(frozen=True)
class TrainBatch:
    """One policy-gradient step on sequences the rollout sampled.

    ``old_logprobs[i]``: the rollout's logprobs of sequence ``i``'s response tokens (those after
    ``prompt_lens[i]``); ``advantages[i]``: the sequence's advantage, shared by its tokens.
    Loss (PPO clip, token mean over the whole batch): ``-mean(min(r * A, clip(r, 1 - e, 1 + e) * A))``
    with ``r = exp(logp - old_logprobs)``.
    """

    sequences: tuple[tuple[int, ...], ...]
    prompt_lens: tuple[int, ...]
    old_logprobs: tuple[torch.Tensor, ...]
    advantages: tuple[float, ...]
    clip_eps: float = 0.2
    sampling: tuple[Any, ...] | None = None
    """Per sequence, its ``SamplingParams``: the loss scores that processed distribution (see
    ``TrainerRun.sampling``). None: temperature 1."""


@dataclass
class TrainStepResult:
    """What the ranks report for a ``TrainInit`` or ``TrainBatch`` (merged over ranks)."""

    logprobs: list[torch.Tensor] | None = None
    """Per sequence, the response tokens' logprobs of the training forward (before the update)."""
    loss: float | None = None
    loss_if_ratio_one: float | None = None
    """``-sum(advantage) / tokens`` over the same tokens, reduced as ``loss`` is: the loss at a
    ratio of exactly 1 (``min(1 * A, clip(1) * A) = A`` bitwise), so equal to ``loss`` bit for
    bit when every ratio is 1."""
    advantage_logprob: float | None = None
    """``sum(advantage * logprob) / tokens`` over the same tokens (the policy-gradient
    objective's value; float32, reduced as ``loss`` is): the parent recomputes it from the
    advantages it sent and the rollout's logprobs, so an advantage applied to the wrong
    sequence, sign or scale shows."""
    ratio_max_abs_dev: float | None = None
    """``max |exp(logp - old) - 1|`` over the response tokens, as the loss saw it."""
    kl: float | None = None
    """Mean over response tokens of ``exp(old - logp) - (old - logp) - 1`` (k3 estimator)."""
    replica_mismatches: list[str] | None = None
    """Under data parallelism: the parameters (``<name>#main``: their fp32 optimizer copies)
    whose bits differ between DP replicas after the step; empty when all agree. None without
    DP."""
    weights: Any = None
    """HF-named weights after the step, from every TP/PP shard (storage dtype), as one
    ``shared_tensors.SharedTensors`` buffer (``.tensors()`` gives the state dict)."""
    trained: dict[str, int] | None = None
    """Global rank 0's stage, for a ``TrainInit``: elements of the parameters the optimizer
    holds (``trainable``: the LoRA A and B alone when the weights carry an adapter) and of the
    frozen ones (``frozen``: ``requires_grad`` off, no gradient, no optimizer state)."""
    time_s: dict[str, float] | None = None
    """Global rank 0's wall seconds: ``forward_backward`` (the pipeline's forward, loss and
    backward), ``optimizer`` (gradient finalisation and the optimizer step), ``sync`` (the
    weights gathered under HF names into shared memory)."""
