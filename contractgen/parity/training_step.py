"""One trainer layout's run of the RL loop, step by step: the weight push, the rollouts at every
rollout TP (reused across layouts that pushed the same bits), the trainer's PPO-clip step, the
pairs compared bitwise, and the per-layout entry of the report."""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from ..adapters.common.lora import split_adapter
from ..adapters.common.rollout import AS_PUSHED, RolloutJob, WeightSync, weights_digest
from .compare import compare
from .gate_run import GateRun
from .layouts import Layout
from .pairs import pair_name, same_tokens
from .sampling_check import step_three_way
from .step_summary import rollout_parts
from .training_config import (
    DP_DESYNC,
    NO_ADAPTER,
    STALE_ADAPTER,
    STALE_SHARD,
    TrainingConfig,
    _GradCheck,
    _one_side_fault,
    _say,
    grpo_advantages,
    reward,
    stale_tensor,
    step_workload,
)


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


@dataclass
class _LayoutRun:
    """One trainer layout's run: what its steps share (``_run_layout`` builds it)."""

    run: GateRun
    cfg: TrainingConfig
    layout: Layout
    arch: Any
    cache: dict
    """Rollout results by (TP, pushed weights, workload, faults), across layouts."""
    grads: _GradCheck | None
    trainer: Any
    rollout_changes: dict
    trainer_fault: Any
    stale: str | None
    digests: ThreadPoolExecutor
    t0: float
    pushed_adapters: list[str | None] = field(default_factory=list)
    """The adapter digest pushed at each step."""
    base_bytes: int = 0
    """The frozen base's bytes (a LoRA run pushes it once, at step 0)."""


def _run_layout(
    run: GateRun,
    cfg: TrainingConfig,
    layout: Layout,
    arch: Any,
    cache: dict,
    grads: _GradCheck | None = None,
):
    """Yield ``(per-layout entry, pairs, step)`` for each step of one trainer layout's run;
    ``cache`` holds rollout results by (TP, pushed weights, workload, faults) across layouts;
    ``grads`` checks the step-0 gradient."""
    trainer_api = run.trainer_adapter
    OptimizerSettings, TrainInit = trainer_api.OptimizerSettings, trainer_api.TrainInit
    TrainerSession = trainer_api.TrainerSession

    config = run.config
    rollout_changes, trainer_fault = _one_side_fault(run, cfg.fault, layout)
    stale = stale_tensor(arch) if cfg.fault == STALE_SHARD else None
    t0 = time.perf_counter()
    digests = ThreadPoolExecutor(1, thread_name_prefix="weights-digest")
    trainer = TrainerSession(
        config.contract_id,
        config.weights,
        layout,
        device=config.device,
    )
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
        state = _LayoutRun(
            run,
            cfg,
            layout,
            arch,
            cache,
            grads,
            trainer,
            rollout_changes,
            trainer_fault,
            stale,
            digests,
            t0,
        )
        for step in range(cfg.steps):
            entry, step_pairs, result = _train_step(state, step, weights, trained)
            yield entry, step_pairs, step
            weights = result.weights
    finally:
        digests.shutdown(wait=True)
        trainer.close()


def _train_step(s: _LayoutRun, step: int, weights: Any, trained: Any):
    """One step of ``s``'s layout: push, rollouts, the trainer's step, the pairs compared;
    ``(per-layout entry, pairs, the trainer's step result)``."""
    config, cfg, arch = s.run.config, s.cfg, s.arch
    clock = step_start = time.perf_counter()
    workload = step_workload(step, cfg, arch.vocab_size)
    # the push's digest is hashed while the rollout runs (hashlib lets the GIL go); a
    # run that may reuse another layout's rollouts needs it first, for the cache key
    hashing = s.digests.submit(weights_digest, weights.tensors())
    digest = hashing.result() if len(config.layouts) > 1 else None
    push, adapter_digest = _push_of(s, step, weights)
    times = {"digest": _lap(clock)}
    rollouts, reused = _step_rollouts(s, step, weights, workload, digest, times)
    base = rollouts[1]
    times["rollout"] = round(_lap(clock) - times["digest"], 4)
    lap = time.perf_counter()
    digest = hashing.result()
    times["digest"] = round(times["digest"] + _lap(lap), 4)  # the wait for it
    for r in rollouts.values():
        if r.extra["weight_sync"]["digest"] == AS_PUSHED:
            r.extra["weight_sync"]["digest"] = digest
    clock = time.perf_counter()
    rewards = [
        reward(q[p:], arch.vocab_size)
        for q, p in zip(base.sequences, base.prompt_lens, strict=True)
    ]
    advantages = grpo_advantages(rewards, cfg.group_size)
    old = s.run.scored_rollout(base)
    times["score"] = _lap(clock)
    clock = time.perf_counter()
    result = _trainer_step(s, base, old, advantages)
    times["trainer_step"] = _lap(clock)
    times |= {phase: round(t, 4) for phase, t in (result.time_s or {}).items()}
    clock = time.perf_counter()
    step_pairs = _step_pairs(s, rollouts, base, result)
    syncs = {tp: r.extra["weight_sync"] for tp, r in rollouts.items()}
    adapter = adapter_check(
        adapter_digest,
        {f"tp{tp}": q.get("adapter_digest") for tp, q in syncs.items()},
        s.pushed_adapters,
    )
    s.pushed_adapters.append(adapter_digest)
    times["compare"] = _lap(clock)
    clock = time.perf_counter()
    checked = None
    if s.grads is not None and step == 0:
        checked = s.grads.layout(s.trainer, s.layout, base, s.trainer_fault)
    times["grad_check"] = _lap(clock) if checked is not None else None
    times["step"] = round(time.perf_counter() - step_start - (times["grad_check"] or 0), 4)
    entry = _step_entry(s, base, rollouts, result, old, advantages, rewards, syncs)
    entry |= {"rollouts_reused": reused, "push": push, "adapter": adapter, "trained": trained}
    entry |= _step_tail(s, step, base, result, digest, syncs, checked, times)
    if config.progress:
        exact = all(p["exact"] for p in step_pairs)
        _say(
            f"train {s.layout.name} step {step}: {'exact' if exact else 'DIFFERS'}, ratio "
            f"dev {entry['ratio_max_abs_dev']:.3g}, loss {entry['loss']:.4f}, reward "
            f"{entry['reward_mean']:.3f}, weights "
            f"{'synced' if _synced(entry) else 'NOT synced'} "
            f"({time.perf_counter() - s.t0:.1f} s)"
        )
    return entry, step_pairs, result


def _push_of(s: _LayoutRun, step: int, weights: Any) -> tuple[dict, str | None]:
    """The step's ``push`` (bytes pushed against the full weights', tensors, adapter only) and
    the pushed adapter's digest (None: no adapter)."""
    base_part, adapter_part = split_adapter(weights.tensors())
    if step == 0:
        s.base_bytes = _nbytes(base_part)
    push = {
        "bytes": _nbytes(weights.tensors()),
        "full_bytes": s.base_bytes + _nbytes(adapter_part),
        "tensors": len(weights.tensors()),
        "adapter_only": bool(adapter_part) and not base_part,
    }
    return push, weights_digest(adapter_part) if adapter_part else None


def _step_rollouts(
    s: _LayoutRun, step: int, weights: Any, workload: Any, digest: str | None, times: dict
) -> tuple[dict, list[int]]:
    """``({TP: rollout result}, TPs reused from another layout's run)`` of the step, every
    rollout TP (TP=1 first: the reference) taking the pushed weights in; ``times`` gets each
    rollout's phases."""
    config, cfg = s.run.config, s.cfg
    skip_adapter = cfg.fault == NO_ADAPTER or (cfg.fault == STALE_ADAPTER and step > 0)
    rollouts, reused = {}, []
    for tp in sorted({1, *config.rollout_tps}):  # TP=1 first: the reference
        sync = WeightSync(
            reset=step == 0,
            stale=s.stale if step > 0 else None,
            digest=digest or AS_PUSHED,
            skip_adapter=skip_adapter,
        )
        job = RolloutJob(
            config.contract_id,
            weights,
            tp,
            workload=workload,
            device=config.device,
            arch=s.arch,
            weight_sync=sync,
            planted_bugs=config.planted_bugs,
            **s.rollout_changes,
        )
        # A full push replaces everything the ranks held, so the run is a function of the
        # pushed weights: another layout that pushed the same bits reuses it (a LoRA
        # adapter push too: the base under it is the same frozen step-0 push).
        faulted = sync.stale or sync.skip_adapter
        key = None if faulted or digest is None else (tp, digest, workload, repr(s.rollout_changes))
        if key is not None and key in s.cache:
            reused.append(tp)
            rollouts[tp] = s.cache[key]
            continue
        rollouts[tp] = s.run.rollout_session(tp).run(job)
        for part, seconds in rollout_parts(rollouts[tp]).items():
            times[part] = round(times.get(part, 0.0) + seconds, 4)
        if key is not None:
            s.cache[key] = rollouts[tp]
    return rollouts, reused


def _trainer_step(s: _LayoutRun, base: Any, old: list, advantages: list[float]) -> Any:
    """The trainer's PPO-clip step on the reference rollout's samples."""
    TrainBatch = s.run.trainer_adapter.TrainBatch
    return s.trainer.train(
        TrainBatch(
            tuple(tuple(q) for q in base.sequences),
            tuple(base.prompt_lens),
            tuple(old),
            tuple(advantages),
            s.cfg.clip_eps,
            sampling=tuple(base.sampling),
        )
    )


def _step_pairs(s: _LayoutRun, rollouts: dict, base: Any, result: Any) -> list[dict]:
    """Each rollout TP's logprobs against the trainer's, bitwise (where it sampled the same)."""
    step_pairs = []
    for tp, r in rollouts.items():
        same = same_tokens(r, base)
        cmp = compare(s.run.scored_rollout(r), result.logprobs) if same else None
        step_pairs.append(
            {
                "name": pair_name(tp, s.layout),
                "rollout_tp": tp,
                "trainer": s.layout.sizes,
                "exact": bool(cmp and cmp.exact),
                "max_abs_diff": cmp.max_abs_diff if cmp else None,
                "tokens_compared": cmp.tokens_compared if cmp else 0,
                "note": None if same else f"rollout tp{tp} sampled other tokens",
            }
        )
    return step_pairs


def _step_entry(
    s: _LayoutRun,
    base: Any,
    rollouts: dict,
    result: Any,
    old: list,
    advantages: list[float],
    rewards: list[float],
    syncs: dict,
) -> dict:
    """The per-layout entry's loss, ratio and sync fields (``_train_step`` adds the rest)."""
    want, bound = advantage_logprob(old, advantages)
    return {
        "name": s.layout.name,
        **s.layout.sizes,
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
        "weights_synced": all(q["synced"] for q in syncs.values()),
        "dp_replicas_identical": not result.replica_mismatches,
        "dp_mismatched": result.replica_mismatches,
        "stale": {
            f"tp{tp}": q["mismatched"] + q["problems"] for tp, q in syncs.items() if not q["synced"]
        },
        "rollout_tokens_identical": all(same_tokens(r, base) for r in rollouts.values()),
    }


def _step_tail(
    s: _LayoutRun,
    step: int,
    base: Any,
    result: Any,
    digest: str,
    syncs: dict,
    checked: dict | None,
    times: dict,
) -> dict:
    """The per-layout entry's three-way check, gradients, throughput and times."""
    tokens = sum(len(q) - p for q, p in zip(base.sequences, base.prompt_lens, strict=True))
    return {
        "three_way": step_three_way(
            s.run.logprob_contract, base, result.logprobs, digest, syncs, step
        ),
        "grads": checked,
        "response_tokens": tokens,
        "response_tokens_per_s": round(tokens / times["step"], 2),
        "time_s": times,
    }


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


def _lap(start: float) -> float:
    return round(time.perf_counter() - start, 4)
