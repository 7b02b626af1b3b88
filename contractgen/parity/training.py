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
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..adapters.common.lora import CHECKPOINT_ADAPTER_FILE, split_adapter
from ..adapters.families import LAYER_PREFIX
from .harness import GateRun, compare, fault_change, pair_name, same_tokens
from .layouts import Layout
from .rollout import weights_digest
from .sampling_check import step_three_way, steps_three_way, three_way_failures
from .workload import PromptSpec, sample_seed

STALE_SHARD = "sync.stale_shard"
DP_DESYNC = "dp.desync_rank"
"""The last data-parallel rank of every DP group skips the gradient reduction (it still joins
the collective) and steps on its own gradient: its replica drifts from step 0's update on."""
STALE_ADAPTER = "sync.stale_adapter"
"""The rollout ignores every LoRA adapter push after step 0: it serves step 0's adapter."""
NO_ADAPTER = "sync.no_adapter"
"""The rollout ignores every LoRA adapter push: it serves the base weights alone."""
ADAPTER_FAULTS = (STALE_ADAPTER, NO_ADAPTER)
SYNC_FAULTS = (STALE_SHARD, DP_DESYNC, *ADAPTER_FAULTS)

TASK = (
    "reward = share of response tokens whose id is below vocab_size / 8 (a verifiable toy task: "
    "no data set); GRPO advantages = (reward - group mean) / (group std + 1e-6)"
)


@dataclass(frozen=True)
class TrainingConfig:
    """What ``--train-steps`` runs (see the module docstring)."""

    steps: int
    prompts: int = 2
    group_size: int = 4
    prompt_tokens: int = 70
    new_tokens: int = 10
    lr: float = 1e-2
    clip_eps: float = 0.2
    fault: str | None = None
    temperature: float = 1.0
    """The rollout's sampling temperature; the trainer scores the same processed distribution."""
    grad_check: bool = True
    """Check each layout's step-0 gradient against float64 autograd (``_GradCheck``)."""
    microbatches: int = 1
    """Microbatches per step on each data-parallel rank (gradient accumulation)."""
    distributed_optimizer: bool = False
    """Shard the optimizer state over the DP ranks (the trainer's ``ShardedAdamW``)."""


GRAD_CHECK_LOSS = "minus the sum of the step's response-token logprobs (the --grads loss)"


@dataclass
class _GradCheck:
    """Step 0's gradient check, ``--grads``'s on the step's samples: each layout's trainer, in
    the processes it trains in, takes a float32 backward of ``GRAD_CHECK_LOSS`` at the step-0
    weights (a stage built for it; the training stage is untouched), compared parameter by
    parameter with float64 autograd through transformers (under LoRA the adapter's A and B,
    against peft's float64 autograd with the base frozen). The reference is computed once per set
    of samples (every layout samples the same at step 0 unless a fault moves them)."""

    run: GateRun
    note: str | None
    """Why no layout is checked (transformers unavailable), else None."""
    refs: dict = field(default_factory=dict)

    @property
    def lora(self) -> bool:
        """The gate serves an adapter: the check compares A's and B's gradients only."""
        weights = getattr(self.run.config, "weights", None)
        if isinstance(weights, (str, Path)):
            return (Path(weights) / CHECKPOINT_ADAPTER_FILE).is_file()
        return isinstance(weights, dict) and bool(split_adapter(weights)[1])

    def layout(self, trainer: Any, layout: Layout, base: Any, fault: Any) -> dict | None:
        from .correctness import compare_grads, grad_reference_of, grads_run

        if self.note is not None:
            return None
        if not getattr(self.run.trainer_adapter, "GRADIENT_RUN", True):
            return {"name": layout.name, **layout.sizes, "supported": False,
                    "note": f"not supported: the {self.run.trainer_target} trainer has no "
                    "gradient run (TrainerRun.grads) yet"}  # fmt: skip
        key = tuple(tuple(s) for s in base.sequences)
        if key not in self.refs:
            seqs = [list(s) for s in base.sequences]
            self.refs[key] = grad_reference_of(self.run.config, seqs, list(base.prompt_lens))
        ref = self.refs[key]
        run = grads_run(ref, fault=fault, planted_bugs=self.run.config.planted_bugs)
        return compare_grads(ref, layout, trainer.logprobs(ref.sequences, run).hf_grads)

    def report(self, entries: list[dict]) -> dict:
        """A step's ``grads``: the settings and each layout's comparison."""
        from .correctness import GRAD_TOLERANCE

        return {
            "dtype": "float32 trainer vs float64 transformers autograd"
            + (" (peft: the adapter's A and B; the base is frozen)" if self.lora else ""),
            "loss": GRAD_CHECK_LOSS,
            "tolerance": GRAD_TOLERANCE,
            "tolerance_meaning": "max |grad - float64 grad| / max |float64 grad|, per parameter",
            "note": self.note,
            "per_layout": [e["grads"] for e in entries if e.get("grads") is not None],
        }


def _grad_check(run: GateRun, cfg: TrainingConfig) -> _GradCheck | None:
    from .reference import transformers_reason

    if not cfg.grad_check:
        return None
    return _GradCheck(run, transformers_reason())


def _say(message: str) -> None:
    print(f"parity: {message}", file=sys.stderr, flush=True)


def step_workload(step: int, cfg: TrainingConfig, vocab_size: int) -> tuple[PromptSpec, ...]:
    """The step's requests: ``cfg.prompts`` fresh prompts (the longest ``prompt_tokens`` long,
    the others spread below), each sampled ``group_size`` times at ``cfg.temperature`` with a
    seed of its own (``sample_seed``), joining the batch at staggered decode steps."""
    g = torch.Generator().manual_seed(10_000 + step)
    specs = []
    for i in range(cfg.prompts):
        n = max(1, cfg.prompt_tokens * (cfg.prompts - i) // cfg.prompts)
        prompt = tuple(torch.randint(0, vocab_size, (n,), generator=g).tolist())
        for j in range(cfg.group_size):
            k = i * cfg.group_size + j
            specs.append(
                PromptSpec(
                    rid=f"s{step}p{i}g{j}",
                    prompt_len=n,
                    max_new_tokens=cfg.new_tokens,
                    temperature=cfg.temperature,
                    seed=sample_seed(0, step, i, j),
                    arrival_step=k % 3,
                    prompt_ids=prompt,
                )  # fmt: skip
            )
    return tuple(specs)


def reward(response: list[int], vocab_size: int) -> float:
    """The toy task's reward of one response (see ``TASK``)."""
    return sum(t < vocab_size // 8 for t in response) / max(1, len(response))


def grpo_advantages(rewards: list[float], group_size: int) -> list[float]:
    """Each reward minus its group's mean, over the group's (population) std + 1e-6."""
    out = []
    for lo in range(0, len(rewards), group_size):
        group = rewards[lo : lo + group_size]
        mean, std = statistics.fmean(group), statistics.pstdev(group)
        out += [(r - mean) / (std + 1e-6) for r in group]
    return out


def stale_tensor(arch: Any) -> str:
    """The tensor ``sync.stale_shard`` leaves stale: layer 0's last row-parallel weight (TP shards
    it by K, so at TP > 1 one rank's slice is stale)."""
    spec = arch.spec
    rows = [w.hf_name for w in spec.layer_weights.values() if w.shard == "row"]
    return LAYER_PREFIX.format(i=0) + rows[-1]


def training_faults(run: GateRun) -> list[str]:
    """Every name ``--train-fault`` accepts."""
    from .faults import catalogue
    from .harness import _policies_at

    first = run.layouts[0]
    return [*SYNC_FAULTS, *(f.name for f in catalogue(*_policies_at(run, first)))]


def _one_side_fault(run: GateRun, name: str | None, layout: Layout):
    """(rollout ``RolloutJob`` changes, trainer ``TrainerFault`` or None) for a policy fault."""
    TrainerFault = run.trainer_adapter.TrainerFault
    from .faults import catalogue
    from .harness import _policies_at

    if name is None or name in SYNC_FAULTS:
        return {}, None
    fault = next(f for f in catalogue(*_policies_at(run, layout)) if f.name == name)
    change = fault_change(run, fault, layout)
    if fault.side == "rollout":
        return {f"{fault.kind}_changes": change}, None
    return {}, TrainerFault(**{f"{fault.kind}_policy": change})


def run_training(run: GateRun, cfg: TrainingConfig) -> dict:
    """Every trainer layout's run of ``cfg.steps`` steps; the report's ``training`` and ``steps``."""
    from .rollout import arch_of

    arch = arch_of(run.config.contract_id, run.config.weights)
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
                "ratio_max_abs_dev": _worst(e["ratio_max_abs_dev"] for e in entries),
                "kl": _worst(e["kl"] for e in entries),
                "loss": statistics.fmean(e["loss"] for e in entries),
                "reward_mean": statistics.fmean(e["reward_mean"] for e in entries),
                "weights_synced": all(e["weights_synced"] for e in entries),
                "dp_replicas_identical": all(e["dp_replicas_identical"] for e in entries),
                "rollout_tokens_identical": all(e["rollout_tokens_identical"] for e in entries),
                "adapter_synced": all(e["adapter"]["synced"] for e in entries if e["adapter"]),
                "push": _step_push(entries),
                "three_way": steps_three_way(entries),
                "grads": grads.report(entries) if grads is not None and step == 0 else None,
                "time_s": _summed_times(entries),
                "response_tokens_per_s": _tokens_per_s(entries),
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
            },  # fmt: skip
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


def _step_push(entries: list[dict]) -> dict:
    """A step's ``push``: the largest push of any layout (they push the same tensors) and its
    share of the full weights' bytes."""
    worst = max(entries, key=lambda e: e["push"]["bytes"])["push"]
    return {**worst, "fraction": round(worst["bytes"] / worst["full_bytes"], 6)}


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def adapter_check(
    pushed: str | None, served: dict[str, str | None], history: list[str | None]
) -> dict | None:
    """The step's adapter handshake: ``pushed``, the digest of the adapter the trainer pushed
    (None: the weights carry none, nothing to check); ``served``, each rollout TP's digest of the
    adapter it serves; ``history``, the digests pushed at earlier steps (to name a stale one)."""
    if pushed is None:
        return None
    notes = {}
    for tp, got in served.items():
        if got == pushed:
            continue
        if got is None:
            notes[tp] = "the rollout ran on the base weights alone"
        elif got in history:
            notes[tp] = f"step {history.index(got)}'s adapter: stale"
        else:
            notes[tp] = "an adapter the trainer never pushed"
    return {"pushed": pushed, "served": served, "synced": not notes, "mismatch": notes}


def _worst(values) -> float:
    return max((abs(v) for v in values), default=0.0)


def _tokens_per_s(entries: list[dict]) -> float:
    """A step's response tokens over its wall time without the gradient check (``time_s.step``),
    both summed over the trainer layouts (which run one after another)."""
    seconds = sum(e["time_s"]["step"] for e in entries)
    return round(sum(e["response_tokens"] for e in entries) / seconds, 2) if seconds else 0.0


def rollout_parts(result: Any) -> dict[str, float]:
    """Where a rollout run's time went on its rank 0 (``RolloutResult``): taking the pushed
    weights in (``rollout_load``), checking them (``rollout_sync_check``), generating and
    re-scoring."""
    return {
        **{f"rollout_{k}": v for k, v in result.extra.get("time_s", {}).items()},
        "rollout_generate": result.generate_seconds,
        "rollout_rescore": result.rescore_seconds,
    }


def _summed_times(entries: list[dict]) -> dict[str, float]:
    """A step's ``time_s``: each phase summed over the trainer layouts (run one after another)."""
    out: dict[str, float] = {}
    for e in entries:
        for phase, seconds in e["time_s"].items():
            if seconds is not None:
                out[phase] = round(out.get(phase, 0.0) + seconds, 4)
    return out


def _run_layout(
    run: GateRun, cfg: TrainingConfig, layout: Layout, arch: Any, cache: dict,
    grads: _GradCheck | None = None,
):  # fmt: skip
    """Yield ``(per-layout entry, pairs, step)`` for each step of one trainer layout's run;
    ``cache`` holds rollout results by (TP, pushed weights, workload, faults) across layouts;
    ``grads`` checks the step-0 gradient."""
    trainer_api = run.trainer_adapter
    OptimizerSettings, TrainBatch, TrainInit = (
        trainer_api.OptimizerSettings, trainer_api.TrainBatch, trainer_api.TrainInit
    )  # fmt: skip
    TrainerSession = trainer_api.TrainerSession
    from .rollout import AS_PUSHED, RolloutJob, WeightSync

    config = run.config
    rollout_changes, trainer_fault = _one_side_fault(run, cfg.fault, layout)
    stale = stale_tensor(arch) if cfg.fault == STALE_SHARD else None
    pushed_adapters: list[str | None] = []  # the adapter digest pushed at each step
    base_bytes = 0  # the frozen base's bytes (a LoRA run pushes it once, at step 0)
    t0 = time.perf_counter()
    digests = ThreadPoolExecutor(1, thread_name_prefix="weights-digest")
    trainer = TrainerSession(
        config.contract_id, config.weights, layout,
        device=config.device,
    )  # fmt: skip
    trainer.start()
    try:
        init = trainer.train(
            TrainInit(
                OptimizerSettings(lr=cfg.lr),
                fault=trainer_fault,
                planted_bugs=config.planted_bugs,
                microbatches=cfg.microbatches,
                distributed_optimizer=cfg.distributed_optimizer,
                desync_dp=cfg.fault == DP_DESYNC,
            )
        )
        weights, trained = init.weights, init.trained
        for step in range(cfg.steps):
            clock = step_start = time.perf_counter()
            workload = step_workload(step, cfg, arch.vocab_size)
            # the push's digest is hashed while the rollout runs (hashlib lets the GIL go); a
            # run that may reuse another layout's rollouts needs it first, for the cache key
            hashing = digests.submit(weights_digest, weights.tensors())
            digest = hashing.result() if len(config.layouts) > 1 else None
            base_part, adapter_part = split_adapter(weights.tensors())
            if step == 0:
                base_bytes = _nbytes(base_part)
            push = {
                "bytes": _nbytes(weights.tensors()),
                "full_bytes": base_bytes + _nbytes(adapter_part),
                "tensors": len(weights.tensors()),
                "adapter_only": bool(adapter_part) and not base_part,
            }
            adapter_digest = weights_digest(adapter_part) if adapter_part else None
            skip_adapter = cfg.fault == NO_ADAPTER or (cfg.fault == STALE_ADAPTER and step > 0)
            rollouts, reused = {}, []
            times = {"digest": _lap(clock)}
            for tp in sorted({1, *config.rollout_tps}):  # TP=1 first: the reference
                sync = WeightSync(
                    reset=step == 0, stale=stale if step > 0 else None,
                    digest=digest or AS_PUSHED, skip_adapter=skip_adapter,
                )  # fmt: skip
                job = RolloutJob(
                    config.contract_id, weights, tp, workload=workload, device=config.device,
                    arch=arch, weight_sync=sync, planted_bugs=config.planted_bugs,
                    **rollout_changes,
                )  # fmt: skip
                # A full push replaces everything the ranks held, so the run is a function of the
                # pushed weights: another layout that pushed the same bits reuses it (a LoRA
                # adapter push too: the base under it is the same frozen step-0 push).
                faulted = sync.stale or sync.skip_adapter
                key = None if faulted or digest is None else (tp, digest, workload, repr(rollout_changes))  # fmt: skip
                if key is not None and key in cache:
                    reused.append(tp)
                    rollouts[tp] = cache[key]
                    continue
                rollouts[tp] = run.rollout_session(tp).run(job)
                for part, seconds in rollout_parts(rollouts[tp]).items():
                    times[part] = round(times.get(part, 0.0) + seconds, 4)
                if key is not None:
                    cache[key] = rollouts[tp]
            base = rollouts[1]
            times["rollout"] = round(_lap(clock) - times["digest"], 4)
            lap = time.perf_counter()
            digest = hashing.result()
            times["digest"] = round(times["digest"] + _lap(lap), 4)  # the wait for it
            for r in rollouts.values():
                if r.extra["weight_sync"]["digest"] == AS_PUSHED:
                    r.extra["weight_sync"]["digest"] = digest
            clock = time.perf_counter()
            rewards = [reward(s[p:], arch.vocab_size) for s, p in zip(base.sequences, base.prompt_lens, strict=True)]  # fmt: skip
            advantages = grpo_advantages(rewards, cfg.group_size)
            old = run.scored_rollout(base)
            times["score"] = _lap(clock)
            clock = time.perf_counter()
            result = trainer.train(
                TrainBatch(
                    tuple(tuple(s) for s in base.sequences),
                    tuple(base.prompt_lens),
                    tuple(old),
                    tuple(advantages),
                    cfg.clip_eps,
                    sampling=tuple(base.sampling),
                )  # fmt: skip
            )
            times["trainer_step"] = _lap(clock)
            times |= {phase: round(t, 4) for phase, t in (result.time_s or {}).items()}
            clock = time.perf_counter()
            step_pairs = []
            for tp, r in rollouts.items():
                same = same_tokens(r, base)
                cmp = compare(run.scored_rollout(r), result.logprobs) if same else None
                step_pairs.append(
                    {
                        "name": pair_name(tp, layout),
                        "rollout_tp": tp,
                        "trainer": layout.sizes,
                        "exact": bool(cmp and cmp.exact),
                        "max_abs_diff": cmp.max_abs_diff if cmp else None,
                        "tokens_compared": cmp.tokens_compared if cmp else 0,
                        "note": None if same else f"rollout tp{tp} sampled other tokens",
                    }
                )
            syncs = {tp: r.extra["weight_sync"] for tp, r in rollouts.items()}
            adapter = adapter_check(
                adapter_digest,
                {f"tp{tp}": s.get("adapter_digest") for tp, s in syncs.items()},
                pushed_adapters,
            )
            pushed_adapters.append(adapter_digest)
            times["compare"] = _lap(clock)
            clock = time.perf_counter()
            checked = None
            if grads is not None and step == 0:
                checked = grads.layout(trainer, layout, base, trainer_fault)
            times["grad_check"] = _lap(clock) if checked is not None else None
            times["step"] = round(time.perf_counter() - step_start - (times["grad_check"] or 0), 4)
            tokens = sum(len(s) - p for s, p in zip(base.sequences, base.prompt_lens, strict=True))
            want, bound = advantage_logprob(old, advantages)
            entry = {
                "name": layout.name,
                **layout.sizes,
                "loss": result.loss,
                "loss_if_ratio_one": result.loss_if_ratio_one,
                "advantage_logprob": result.advantage_logprob,
                "advantage_logprob_want": want,
                "advantage_logprob_bound": bound,
                "kl": result.kl,
                "ratio_max_abs_dev": result.ratio_max_abs_dev,
                "reward_mean": statistics.fmean(rewards),
                "rewards": rewards,
                "advantages": advantages,
                "weights_synced": all(s["synced"] for s in syncs.values()),
                "dp_replicas_identical": not result.replica_mismatches,
                "dp_mismatched": result.replica_mismatches,
                "stale": {
                    f"tp{tp}": s["mismatched"] + s["problems"]
                    for tp, s in syncs.items()
                    if not s["synced"]
                },
                "rollout_tokens_identical": all(same_tokens(r, base) for r in rollouts.values()),
                "rollouts_reused": reused,
                "push": push,
                "adapter": adapter,
                "trained": trained,
                "three_way": step_three_way(
                    run.logprob_contract, base, result.logprobs, digest, syncs, step
                ),
                "grads": checked,
                "response_tokens": tokens,
                "response_tokens_per_s": round(tokens / times["step"], 2),
                "time_s": times,
            }
            if config.progress:
                exact = all(p["exact"] for p in step_pairs)
                _say(
                    f"train {layout.name} step {step}: {'exact' if exact else 'DIFFERS'}, ratio "
                    f"dev {entry['ratio_max_abs_dev']:.3g}, loss {entry['loss']:.4f}, reward "
                    f"{entry['reward_mean']:.3f}, weights "
                    f"{'synced' if _synced(entry) else 'NOT synced'} "
                    f"({time.perf_counter() - t0:.1f} s)"
                )
            yield entry, step_pairs, step
            weights = result.weights
    finally:
        digests.shutdown(wait=True)
        trainer.close()


def _synced(entry: dict) -> bool:
    """The rollout holds the pushed weights (and serves the pushed adapter), and every DP
    replica the same ones."""
    adapter = entry.get("adapter")
    adapter_ok = entry.get("adapter_synced", True) if adapter is None else adapter["synced"]
    return entry["weights_synced"] and entry.get("dp_replicas_identical", True) and adapter_ok


def advantage_logprob(old: list[torch.Tensor], advantages: list[float]) -> tuple[float, float]:
    """What the trainer's ``advantage_logprob`` must be, from what the step sent it: ``(sum of
    advantage * rollout logprob over the response tokens / tokens`` in float64, ``the rounding
    bound of the trainer's float32 value)``. The bound is the worst case of a float32 sum of ``n``
    terms, each a float32 product with the advantage rounded to float32: ``(n + 4) u sum|term|``
    over ``n``, ``u = 2**-24``."""
    terms = torch.cat([lp.double() * a for lp, a in zip(old, advantages, strict=True)])
    n = max(1, terms.numel())
    return float(terms.sum()) / n, (n + 4) * 2.0**-24 * float(terms.abs().sum()) / n


def _bits(x: float) -> bytes:
    """A float's bit pattern (``-0.0 == 0.0`` as values)."""
    return struct.pack("<d", x)


def _lap(start: float) -> float:
    return round(time.perf_counter() - start, 4)


def failures(report: dict) -> list[str]:
    """Why a training run fails (empty: it passes)."""
    out = []
    for s in report["steps"]:
        out += [f"step {s['step']}: {p['name']} not exact" for p in s["pairs"] if not p["exact"]]
        out += three_way_failures(s)
        if s["ratio_max_abs_dev"] != 0.0:
            out.append(f"step {s['step']}: importance ratio off 1 by {s['ratio_max_abs_dev']:.3g}")
        out += [
            f"step {s['step']}: {e['name']}: loss {e['loss']!r} is not its value at ratio 1, "
            f"{e['loss_if_ratio_one']!r}"
            for e in s["per_layout"]
            if _bits(e["loss"]) != _bits(e["loss_if_ratio_one"])
        ]
        out += [
            f"step {s['step']}: {e['name']}: the trainer's advantage-weighted logprob "
            f"{e['advantage_logprob']!r} is not the step's ({e['advantage_logprob_want']!r} +- "
            f"{e['advantage_logprob_bound']:.2g}): the advantages it applied are not the ones "
            "sent for its sequences"
            for e in s["per_layout"]
            if not abs(e["advantage_logprob"] - e["advantage_logprob_want"])
            <= e["advantage_logprob_bound"]
        ]
        grads = s.get("grads")
        if grads is not None:
            out += [
                f"step {s['step']}: gradients at {g['name']} off float64 "
                f"({g['max_rel_diff']:.3g} > {grads['tolerance']})"
                for g in grads["per_layout"]
                if g.get("supported", True) and not g["within_tolerance"]
            ]
        out += [
            f"step {s['step']}: {e['name']}: rollout weights differ from the trainer's: "
            + "; ".join(f"{tp} {', '.join(names[:3])}" for tp, names in e["stale"].items())
            for e in s["per_layout"]
            if not e["weights_synced"]
        ]
        out += [
            f"step {s['step']}: {e['name']}: adapter digest mismatch: rollout {tp} serves "
            f"{_short(e['adapter']['served'][tp])}, the trainer pushed "
            f"{_short(e['adapter']['pushed'])} ({why})"
            for e in s["per_layout"]
            if e.get("adapter") and not e["adapter"]["synced"]
            for tp, why in e["adapter"]["mismatch"].items()
        ]
        out += [
            f"step {s['step']}: {e['name']}: data-parallel replicas differ after the step: "
            + ", ".join(e["dp_mismatched"][:3])
            + (f" (+{len(e['dp_mismatched']) - 3} more)" if len(e["dp_mismatched"]) > 3 else "")
            for e in s["per_layout"]
            if not e.get("dp_replicas_identical", True)
        ]
    return out


def _short(digest: str | None) -> str:
    return "no adapter" if digest is None else f"sha256:{digest[:12]}"


def table(report: dict) -> list[str]:
    """The text table's training lines: one per step."""
    t = report["training"]
    lines = [
        f"training  {t['steps']} steps; {t['prompts_per_step']} prompts x {t['group_size']} "
        f"samples, {t['new_tokens']} new tokens each"
        + (
            f", {t['microbatches']} microbatches per DP rank"
            if t.get("microbatches", 1) > 1
            else ""
        ),
        f"          {t['task']}",
        f"          {t['loss']}; {t['optimizer']}",
    ]
    if t["fault"]:
        lines.append(f"fault     {t['fault']} (one side only: must FAIL)")
    if t.get("planted_bugs"):
        lines.append(f"planted   {', '.join(t['planted_bugs'])} (on both sides: must FAIL)")
    lines += [
        "",
        f"{'step':<6}{'pairs exact':>12}  {'max|ratio-1|':>12}  {'kl':>9}  {'loss':>9}  "
        f"{'reward':>7}  {'3-way':>5}  weights",
    ]
    for s in report["steps"]:
        exact = f"{sum(p['exact'] for p in s['pairs'])}/{len(s['pairs'])}"
        lines.append(
            f"{s['step']:<6}{exact:>12}  {s['ratio_max_abs_dev']:>12.3g}  "
            f"{s['kl']:>9.3g}  {s['loss']:>9.4f}  {s['reward_mean']:>7.3f}  "
            f"{s['three_way']['mismatch_count']:>5}  "
            f"{'synced' if _synced(s) else 'NOT synced'}"
        )
    lines += _push_lines(report)
    lines += _grads_lines(report)
    return lines


def _push_lines(report: dict) -> list[str]:
    """Under LoRA: what each step's push carried, and the adapter handshake."""
    steps = report["steps"]
    if not any(e.get("adapter") for s in steps for e in s["per_layout"]):
        return []
    out = ["", "push      (bytes per push; full = base + adapter; adapter sha256 pushed / served)"]
    for s in steps:
        p = s["push"]
        what = "adapter only" if p["adapter_only"] else "base + adapter"
        digests = {e["adapter"]["pushed"] for e in s["per_layout"]}
        verdict = "served" if s["adapter_synced"] else "MISMATCH"
        digest = _short(next(iter(digests))) if len(digests) == 1 else f"{len(digests)} adapters"
        out.append(
            f"step {s['step']:<3}{what:<15}{p['bytes']:>10} of {p['full_bytes']:>10} bytes "
            f"({p['fraction']:.2%})  {digest} {verdict}"
        )
    return out


def _grads_lines(report: dict) -> list[str]:
    """The step-0 gradient check's lines (none with ``--no-grad-check``)."""
    out = []
    for s in report["steps"]:
        grads = s.get("grads")
        if grads is None:
            continue
        out += ["", f"grads     step {s['step']}: {grads['dtype']}, {grads['loss']}, "
                f"tolerance {grads['tolerance']} (relative)"]  # fmt: skip
        if grads["note"]:
            out.append(f"          none: {grads['note']}")
        for g in grads["per_layout"]:
            if not g.get("supported", True):
                out.append(f"          {g['name']:<10} {g['note']}")
                continue
            verdict = "ok" if g["within_tolerance"] else "OFF"
            out.append(f"          {g['name']:<10} max rel {g['max_rel_diff']:.3g}  {verdict}")
    return out
