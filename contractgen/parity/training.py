"""``parity --train-steps N``: the gate over N steps of RL, with weight sync.

Per trainer layout, a run of its own (each layout trains its own copy of the weights):

1. the trainer ranks build their stage and optimizer and push their weights (gathered from every
   TP/PP shard into HF names) to the rollout at every rollout TP, which loads them as an engine
   takes an update (each rank keeps what it holds; the shards it loaded are gathered back and
   compared bitwise with what was pushed: ``weights_synced``);
2. the rollout samples the step's prompts, ``group_size`` samples each (at ``temperature``, 1 by
   default; each sample's seed from (step, prompt, sample index): ``workload.sample_seed``);
3. a toy verifiable reward (no data set: the share of response tokens whose id is below
   ``vocab_size / 8``) gives GRPO advantages (reward minus its group's mean, over the group's
   standard deviation);
4. the trainer scores the same tokens in its training forward and takes a PPO-clip step against
   the rollout's logprobs (the ones the contract's logprob contract names): the importance ratio
   ``exp(logp_trainer - logp_rollout)`` is exactly 1 for every token when the two sides agree
   bitwise, and the step's pairs are compared with ``torch.equal``;
5. the updated weights are pushed for the next step (back to 1).

Step 0 also checks each layout's gradient against float64 autograd (``_GradCheck``;
``--no-grad-check`` skips it), and every step checks the loss against its value at a ratio of
exactly 1 (``loss_if_ratio_one``, minus the token mean of the advantages: bit for bit the loss
only when every ratio is 1). ``time_s`` says where each step's time went: ``digest`` (waiting
for the push's digest, hashed in a thread while the rollout runs), ``rollout`` (every rollout TP, of which ``rollout_load``,
``rollout_sync_check``, ``rollout_generate``, ``rollout_rescore``), ``score``, ``trainer_step``
(of which the trainer's ``forward_backward``, ``optimizer`` and ``sync``, the weight gather),
``compare``, ``grad_check`` and ``step``, the step's wall time without the gradient check;
``response_tokens_per_s`` is the step's response tokens over ``step``.

Training faults (``--train-fault``): any ``--inject-faults`` name flips that field on one side
for the whole run (the ratio moves off 1 at step 0); ``sync.stale_shard`` makes the last rollout
rank keep its old copy of one tensor from the first update on (step 1 differs);
``dp.desync_rank`` makes the last data-parallel rank skip the gradient reduction (its replica's
weights differ after step 0: ``dp_replicas_identical`` fails, and from step 1 its sequences'
ratios leave 1).

LoRA (weights that carry an adapter, ``parity --lora``): the trainer trains A and B only (the
base frozen) and, after step 0's full push, pushes the adapter alone (``push``: bytes pushed vs
the full weights' bytes). Every step is an adapter handshake: each rollout TP reports the
sha256 of the adapter it serves, hashed from what its ranks hold (``sync_report``'s
``adapter_digest``), and it must equal the digest of the adapter the trainer pushed
(``adapter``). ``sync.stale_adapter`` makes the rollout ignore every adapter push after step 0
(it serves step 0's adapter from step 1 on), ``sync.no_adapter`` every adapter push (it serves
the base alone): both must fail on the digests.

Data parallelism (``dp2``, ``tp2dp2``): each DP rank takes every ``dp``-th sequence of the step,
in ``microbatches`` consecutive microbatches; the gradient is accumulated in fp32 and summed over
DP in a fixed tree order (``adapters.megatron.data_parallel``; with ``distributed_optimizer``
reduce-scattered to optimizer shards and the shards all-gathered), and after every step the ranks
compare every parameter and fp32 main copy of their replicas by sha256 (``replica_mismatches``).
"""

from __future__ import annotations

import statistics

from .gate_run import GateRun
from .sampling_check import steps_three_way
from .step_summary import rollout_parts, step_push, summed_times, tokens_per_s, worst
from .targets import rollout_adapter
from .training_config import (
    ADAPTER_FAULTS,
    DP_DESYNC,
    GRAD_CHECK_LOSS,
    NO_ADAPTER,
    STALE_ADAPTER,
    STALE_SHARD,
    SYNC_FAULTS,
    TASK,
    TrainingConfig,
    _grad_check,
    _GradCheck,
    grpo_advantages,
    reward,
    stale_tensor,
    step_workload,
    training_faults,
)
from .training_report import failures, table
from .training_step import (
    _run_layout,
    adapter_check,
    advantage_logprob,
)

# Callers and tests import these names from here.
__all__ = [
    "ADAPTER_FAULTS",
    "DP_DESYNC",
    "GRAD_CHECK_LOSS",
    "NO_ADAPTER",
    "STALE_ADAPTER",
    "STALE_SHARD",
    "SYNC_FAULTS",
    "TASK",
    "TrainingConfig",
    "_GradCheck",
    "adapter_check",
    "advantage_logprob",
    "failures",
    "grpo_advantages",
    "reward",
    "rollout_parts",
    "run_training",
    "stale_tensor",
    "step_workload",
    "table",
    "training_faults",
]


def run_training(run: GateRun, cfg: TrainingConfig) -> dict:
    """Every trainer layout's run of ``cfg.steps`` steps; the report's ``training`` and ``steps``."""
    arch = rollout_adapter().arch_of(run.config.contract_id, run.config.weights)
    per_step: list[list[dict]] = [[] for _ in range(cfg.steps)]
    pairs: list[list[dict]] = [[] for _ in range(cfg.steps)]
    cache: dict = {}
    grads = _grad_check(run, cfg)
    for layout in run.layouts:
        for entry, step_pairs, step in _run_layout(run, cfg, layout, arch, cache, grads):
            per_step[step].append(entry)
            pairs[step].extend(step_pairs)
    steps = []
    for step in range(cfg.steps):
        entries = per_step[step]
        steps.append(
            {
                "step": step,
                "exact": all(p["exact"] for p in pairs[step]),
                "pairs": pairs[step],
                "ratio_max_abs_dev": worst(e["ratio_max_abs_dev"] for e in entries),
                "kl": worst(e["kl"] for e in entries),
                "loss": statistics.fmean(e["loss"] for e in entries),
                "reward_mean": statistics.fmean(e["reward_mean"] for e in entries),
                "weights_synced": all(e["weights_synced"] for e in entries),
                "dp_replicas_identical": all(e["dp_replicas_identical"] for e in entries),
                "rollout_tokens_identical": all(e["rollout_tokens_identical"] for e in entries),
                "adapter_synced": all(e["adapter"]["synced"] for e in entries if e["adapter"]),
                "push": step_push(entries),
                "three_way": steps_three_way(entries),
                "grads": grads.report(entries) if grads is not None and step == 0 else None,
                "time_s": summed_times(entries),
                "response_tokens_per_s": tokens_per_s(entries),
                "per_layout": entries,
            }
        )
    return {
        "training": {
            "steps": cfg.steps,
            "task": TASK,
            "prompts_per_step": cfg.prompts,
            "group_size": cfg.group_size,
            "prompt_tokens": cfg.prompt_tokens,
            "new_tokens": cfg.new_tokens,
            "temperature": cfg.temperature,
            "microbatches": cfg.microbatches,
            "data_parallel": "each DP rank every dp-th sequence, in microbatches; fp32 gradient "
            "accumulation, fixed-tree sum over DP (not megatron-core's DDP, which needs CUDA); "
            + (
                "optimizer state sharded over the DP ranks"
                if cfg.distributed_optimizer
                else "every optimizer state on every DP rank (no distributed optimizer)"
            ),
            "loss": f"PPO clip (eps {cfg.clip_eps}), token mean over the step's response tokens",
            "optimizer": (
                f"AdamW on fp32 shards over the DP ranks (reduce-scatter, all-gather; fixed "
                f"order), lr {cfg.lr}, no weight decay, no grad clipping"
                if cfg.distributed_optimizer
                else f"megatron-core mixed-precision optimizer (fp32 main params), AdamW "
                f"lr {cfg.lr}, no weight decay, no grad clipping"
            ),
            # a trainer target that trains otherwise says how (``TRAINING_DESCRIPTION``)
            **{
                k: v.format(lr=cfg.lr)
                for k, v in getattr(run.trainer_adapter, "TRAINING_DESCRIPTION", {}).items()
            },
            "distributed_optimizer": cfg.distributed_optimizer,
            "fault": cfg.fault,
            "stale_tensor": stale_tensor(arch) if cfg.fault == STALE_SHARD else None,
            "grad_check": cfg.grad_check,
            "planted_bugs": list(run.config.planted_bugs),
            "aggregates": "per step: ratio_max_abs_dev and kl the worst over trainer layouts, "
            "loss and reward_mean their mean (each layout trains its own copy; per_layout has each)",
        },
        "steps": steps,
    }
