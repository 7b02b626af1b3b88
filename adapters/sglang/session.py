"""The reference rollout's ranks: one run of a ``RolloutJob`` at its TP size, with optional faults.

TP=1 on CPU runs in the caller's process; otherwise one process per rank (gloo on CPU, NCCL on
CUDA), kept across runs by ``RolloutSession`` (every rank samples the same tokens from identical
gathered logits; rank 0 reports). Policies come from the generated sglang target
(``policies``), faults applied as field changes. The gate reaches this through the adapter
(``RolloutSession``, ``arch_of``, …); the job and result types are the role's
(``common/rollout.py``).
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from contractgen.codegen.vendored import load_target

from ..common.checkpoint import check_checkpoint, load_checkpoint
from ..common.distributed import Rendezvous, start_process_group
from ..common.memory import release_free_memory
from ..common.model import ModelArch
from ..common.policy import with_dtype
from ..common.rollout import (
    RolloutJob,
    RolloutResult,
    pushed_weights,
    requests_for,
    sync_report,
    update_for,
)
from ..common.workers import RankPool
from ..common.workload import DEFAULT_WORKLOAD, PromptSpec
from ..kernels.audit import maybe_recording, merge
from ..kernels.planted import planted
from .engine import RolloutEngine
from .model import ReferenceModel

TARGET = "sglang"
"""The generated target whose policies this engine runs."""


def policies(
    contract_id: str, tp: int, dtype_override: str | None, kernel_changes, runtime_changes
):
    """(generated module, KernelPolicy, SGLang runtime policy) from the generated sglang target,
    faults applied."""
    gen = load_target(TARGET)
    kp = gen.schema.kernel_policy_for(contract_id)
    if dtype_override is not None:
        kp = with_dtype(kp, dtype_override)
    kp = dataclasses.replace(kp, **dict(kernel_changes))
    rp = gen.runtime_policy.policy_for(contract_id, SimpleNamespace(tp_size=tp))
    rp = dataclasses.replace(rp, **dict(runtime_changes))
    return gen, kp, rp


def model_arch(contract_id: str, weights: Any):
    """(arch, HF state dict) for the contract's reference model or a checkpoint directory."""
    profile = load_target(TARGET).schema.model_profile_for(contract_id)
    if isinstance(weights, (str, os.PathLike)):
        return load_checkpoint(weights, profile)
    return ModelArch.from_profile(profile), weights


def arch_of(contract_id: str, weights: Any):
    """The ``ModelArch`` alone: for a checkpoint directory from its ``config.json`` (the coverage
    check included), without reading its weights as ``model_arch`` does."""
    if isinstance(weights, (str, os.PathLike)):
        profile = load_target(TARGET).schema.model_profile_for(contract_id)
        return ModelArch.from_profile(profile, check_checkpoint(weights, profile))
    return model_arch(contract_id, weights)[0]


# This process's rollout engine, kept across weight-sync runs (one per rank, as a real engine
# holds its model): ``(key, RolloutEngine)``; a run with another key builds a new one.
_ENGINE: list = []


def _held_engine(job: RolloutJob, kp, rp, arch, group, device, update: dict):
    """The engine this rank keeps for ``job`` (same contract, TP, policies, faults, model and
    device), with ``update`` loaded in place (``ReferenceModel.load_weights_``: decode graphs
    captured on the old weights stay valid); built, owning its tensors, on the first push."""
    key = repr(
        (
            job.contract_id,
            job.tp,
            job.dtype_override,
            sorted(job.kernel_changes.items()),
            sorted(job.runtime_changes.items()),
            arch,
            device,
            job.planted_bugs,
        )
    )
    if _ENGINE and _ENGINE[0][0] == key:
        engine = _ENGINE[0][1]
        engine.model.load_weights_(update)
        return engine
    _ENGINE.clear()  # the old model's memory goes before the new one's is taken
    if (
        not job.weight_sync.reset
        and not job.weight_sync.skip_adapter
        and len(update) < len(pushed_weights(job.weights))
    ):
        update = pushed_weights(job.weights)  # nothing held to keep stale: a full load
    model = ReferenceModel(arch, update, kp, rp, group=group, device=device, own=True)
    engine = RolloutEngine(model, progress=False)
    _ENGINE.append((key, engine))
    return engine


def _run(job: RolloutJob, group=None, device: str | None = None) -> RolloutResult:
    with planted(job.planted_bugs), maybe_recording(job.kernel_audit) as calls:
        result = _run_unplanted(job, group, device)
    if device is not None and torch.device(device).type == "cuda":
        # the trainer shares the GPU: the run's freed blocks go back (the kept engine's weights,
        # static KV pool and captured graphs stay)
        torch.cuda.empty_cache()
    if calls is not None:
        result.extra["kernel_calls"] = calls
    return result


def _rescore_only(engine, sequences) -> RolloutResult:
    t0 = time.perf_counter()
    lps = [engine.rescore(seq).cpu() for seq in sequences]
    seconds = time.perf_counter() - t0
    return RolloutResult([list(s) for s in sequences], [1] * len(sequences), [], lps, 0.0, seconds)


def _engine_for(job: RolloutJob, group, device) -> tuple[RolloutEngine, Any, dict | None, dict]:
    """(engine, arch, weight-sync report, its times): the held engine with ``job``'s update
    loaded in place (a weight-sync run), else one built on ``job.weights``."""
    _, kp, rp = policies(
        job.contract_id, job.tp, job.dtype_override, job.kernel_changes, job.runtime_changes
    )
    if job.weight_sync is None:
        arch, weights = model_arch(job.contract_id, job.weights)
        model = ReferenceModel(arch, weights, kp, rp, group=group, device=device)
        return RolloutEngine(model, progress=False), arch, None, {}
    t0 = time.perf_counter()
    rank = dist.get_rank(group) if group is not None else 0
    arch = job.arch if job.arch is not None else model_arch(job.contract_id, {})[0]
    update = update_for(job, rank, job.tp)
    engine = _held_engine(job, kp, rp, arch, group, device, update)
    times = {"load": _synced_clock(device) - t0}
    sync = sync_report(engine.model, pushed_weights(job.weights), job.weight_sync.digest)
    times["sync_check"] = time.perf_counter() - t0 - times["load"]
    return engine, arch, sync, times


def _run_unplanted(job: RolloutJob, group=None, device: str | None = None) -> RolloutResult:
    engine, arch, sync, times = _engine_for(job, group, device)
    if job.rescore_only is not None:
        return _rescore_only(engine, job.rescore_only)
    requests = requests_for(job.workload, arch.vocab_size)
    params = [r.sampling for r in requests]
    t0 = time.perf_counter()
    done = engine.generate(requests)
    t1 = time.perf_counter()
    sequences, prompt_lens, decode_lp, prefill_lp, dumps = [], [], [], [], []
    # one packed prefill re-scores every finished sequence (per sequence when dumping layers)
    packed = None
    if not job.dump_layers:
        packed = engine.rescore_many([done[w.rid].sequence for w in job.workload], params)
    for i, w in enumerate(job.workload):
        c = done[w.rid]
        outputs: list | None = [] if job.dump_layers else None
        if packed is not None:
            rescored = packed[i]
        else:
            rescored = engine.rescore(c.sequence, layer_outputs=outputs, params=params[i])
        sequences.append(c.sequence)
        prompt_lens.append(len(c.prompt))
        decode_lp.append(c.logprob_tensor().cpu())
        prefill_lp.append(rescored[len(c.prompt) - 1 :].cpu())
        if outputs is not None:
            dumps.append([o.cpu() for o in outputs])
    t2 = time.perf_counter()
    return RolloutResult(
        sequences,
        prompt_lens,
        decode_lp,
        prefill_lp,
        t1 - t0,
        t2 - t1,
        dumps if job.dump_layers else None,
        {} if sync is None else {"weight_sync": sync, "time_s": times},
        sampling=params,
    )


def _synced_clock(device: str | None) -> float:
    """``time.perf_counter()`` once ``device``'s queued work is done."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


# torch.distributed backend and per-rank device for each --device choice
BACKENDS = {"cpu": ("gloo", lambda rank: None), "cuda": ("nccl", lambda rank: f"cuda:{rank}")}


def _worker(rank: int, commands, results, tp: int, device: str, port: int) -> None:
    """One TP rank: runs every job it is sent until it receives None."""
    torch.set_num_threads(1)
    _, rank_device = BACKENDS[device]
    start_process_group(rank, tp, port, device)
    try:
        while (job := commands.get()) is not None:
            try:
                result = _run(job, group=dist.group.WORLD, device=rank_device(rank))
                calls = result.extra.get("kernel_calls")
                results.put((rank, "ok", result if rank == 0 else None, calls))
            except Exception:
                results.put((rank, "err", traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class RolloutSession:
    """Rollout TP ranks kept alive across runs (one spawn per TP size, not one per fault)."""

    def __init__(self, tp: int, device: str = "cpu", timeout_s: float = 900.0):
        if device not in BACKENDS:
            raise ValueError(f"device={device!r}: expected one of {sorted(BACKENDS)}")
        self.tp, self.device, self.timeout_s = tp, device, timeout_s
        self._pool = RankPool(
            f"rollout session (TP={tp})",
            tp,
            _worker,
            self._start_args,
            device=device,
            timeout_s=timeout_s,
        )

    def _start_args(self) -> tuple:
        """The ranks' arguments, joined at a rendezvous this session serves (one per start)."""
        self._rendezvous = Rendezvous()
        return (self.tp, self.device, self._rendezvous.port)

    def __enter__(self) -> RolloutSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def run(self, job: RolloutJob) -> RolloutResult:
        """One rollout run on every rank; rank 0's result."""
        if self.tp == 1 and self.device == "cpu":  # in this process: its freed model goes back
            try:
                return _run(job)
            finally:
                release_free_memory()
        replies = self._pool.send(job, "rollout")
        result = replies[0][1]
        if job.kernel_audit is not None:  # every rank's calls, not rank 0's alone
            result.extra["kernel_calls"] = merge({r: p[2] for r, p in replies.items()})
        return result

    def close(self) -> None:
        if self.tp == 1 and self.device == "cpu":  # the engine it kept in this process
            _ENGINE.clear()
        self._pool.close()


def run_rollout(
    contract_id: str,
    weights: Any,
    tp: int = 1,
    *,
    workload: Sequence[PromptSpec] = DEFAULT_WORKLOAD,
    dtype_override: str | None = None,
    kernel_changes: Mapping[str, Any] | None = None,
    runtime_changes: Mapping[str, Any] | None = None,
    dump_layers: bool = False,
    device: str = "cpu",
) -> RolloutResult:
    """Generate the workload and re-score every finished sequence at rollout TP ``tp``."""
    job = RolloutJob(
        contract_id,
        weights,
        tp,
        tuple(workload),
        dtype_override,
        dict(kernel_changes or {}),
        dict(runtime_changes or {}),
        dump_layers,
        device,
    )
    with RolloutSession(tp, device) as session:
        return session.run(job)
