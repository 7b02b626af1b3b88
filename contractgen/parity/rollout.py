"""The rollout side of the gate: the reference rollout at a TP size, with optional faults.

TP=1 runs in this process; TP>1 spawns one gloo process per rank (every rank samples the same
tokens from identical gathered logits; rank 0 reports). Policies come from the generated sglang
target only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from ..adapters.common.distributed import Rendezvous, start_process_group
from ..adapters.common.policy import with_dtype
from ..adapters.common.workers import RankPool
from . import ROLLOUT
from .workload import DEFAULT_WORKLOAD, PromptSpec


@dataclass
class RolloutResult:
    sequences: list[list[int]]
    prompt_lens: list[int]
    decode_logprobs: list[torch.Tensor]  # per request: logprob of each sampled token
    prefill_logprobs: list[torch.Tensor]  # per request: the same tokens re-scored by one prefill
    generate_seconds: float
    rescore_seconds: float
    layer_dumps: list[list[torch.Tensor]] | None = None  # per request: residual after each layer
    extra: dict = field(default_factory=dict)
    sampling: list = field(default_factory=list)
    """Per request: its ``sampling.SamplingParams`` (the processed distribution every side
    scores; empty for ``rescore_only`` runs, scored as the logits are)."""


@dataclass(frozen=True)
class RolloutJob:
    """What one rollout run needs; faults are field changes on the rollout's policies."""

    contract_id: str
    weights: Any  # HF state dict or checkpoint path
    tp: int
    workload: tuple[PromptSpec, ...] = DEFAULT_WORKLOAD
    dtype_override: str | None = None
    kernel_changes: Mapping[str, Any] = field(default_factory=dict)
    runtime_changes: Mapping[str, Any] = field(default_factory=dict)
    dump_layers: bool = False
    device: str = "cpu"
    rescore_only: tuple[tuple[int, ...], ...] | None = None
    """Score these sequences with one prefill each instead of generating (every position)."""
    planted_bugs: tuple[str, ...] = ()
    """Shared-kernel bugs switched on for this run (``kernels.planted``; the gate's self-test)."""
    kernel_audit: str | None = None
    """``"count"`` / ``"strict"``: record the run's contract-kernel calls (and stock ops) into
    ``extra["kernel_calls"]`` (``kernels.audit``, every rank's merged); None: nothing recorded."""
    arch: Any = None
    """The model's ``ModelArch`` when ``weights`` is a state dict of a checkpoint's model (default:
    the contract's reference model)."""
    weight_sync: WeightSync | None = None
    """``weights`` are an update pushed by the trainer (an HF state dict, or a ``SharedTensors``
    of one: one shared-memory buffer): each rank keeps its engine across such runs (``_held``)
    and loads the update into it in place, then the shards it loaded are gathered back and
    compared bitwise with ``weights`` (``RolloutResult.extra["weight_sync"]``)."""


@dataclass(frozen=True)
class WeightSync:
    """How a rollout run takes a weight update (see ``RolloutJob.weight_sync``)."""

    reset: bool = False
    """A new run's first push (every rank loads every tensor, whatever it held)."""
    stale: str | None = None
    """Fault injection: the last rank keeps its old copy of this HF tensor (a lost shard)."""
    digest: str | None = None
    """``weights_digest`` of the pushed weights, when the sender has it (or ``AS_PUSHED``, when
    the sender is still hashing them and fills it in): a rank whose gathered weights equal the
    push bit for bit reports it instead of hashing the same bytes again."""
    skip_adapter: bool = False
    """Fault injection: every rank ignores the update's LoRA adapter tensors (keeps the adapter
    it holds, or none if it never took one), as a rollout whose adapter path was not forwarded
    does (``--train-fault sync.stale_adapter`` / ``sync.no_adapter``)."""


AS_PUSHED = "as-pushed"
"""``WeightSync.digest`` and a synced ``sync_report``'s digest: the pushed weights' own, which
the sender fills in (it hashes them while the rollout runs)."""


def pushed_weights(weights: Any) -> dict[str, torch.Tensor]:
    """An update's HF state dict (views of a ``SharedTensors`` buffer, not copies)."""
    from ..adapters.common.shared_tensors import SharedTensors

    return weights.tensors() if isinstance(weights, SharedTensors) else weights


def _update(job: RolloutJob, rank: int, tp: int) -> dict[str, torch.Tensor]:
    """The part of ``job.weights`` this rank loads (all of it but the stale-shard and the
    adapter faults')."""
    sync, pushed = job.weight_sync, pushed_weights(job.weights)
    if sync.skip_adapter:
        from ..adapters.common.lora import split_adapter

        pushed = split_adapter(pushed)[0]
    if sync.stale is not None and not sync.reset and rank == tp - 1:
        return {name: value for name, value in pushed.items() if name != sync.stale}
    return pushed


# This process's rollout engine, kept across weight-sync runs (one per rank, as a real engine
# holds its model): ``(key, RolloutEngine)``; a run with another key builds a new one.
_ENGINE: list = []


def _held_engine(job: RolloutJob, kp, rp, arch, group, device, update: dict):
    """The engine this rank keeps for ``job`` (same contract, TP, policies, faults, model and
    device), with ``update`` loaded in place (``ReferenceModel.load_weights_``: decode graphs
    captured on the old weights stay valid); built, owning its tensors, on the first push."""
    from .targets import rollout_adapter

    api = rollout_adapter()
    RolloutEngine, ReferenceModel = api.RolloutEngine, api.ReferenceModel

    key = repr((job.contract_id, job.tp, job.dtype_override, sorted(job.kernel_changes.items()),
                sorted(job.runtime_changes.items()), arch, device, job.planted_bugs))  # fmt: skip
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


def weights_digest(weights: dict[str, torch.Tensor]) -> str:
    """A digest of every tensor's name, dtype, shape and bytes (a weights version)."""
    h = hashlib.sha256()
    for name in sorted(weights):
        t = weights[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # the bytes in place, not a copy
    return h.hexdigest()


def _same_bits(held: torch.Tensor, sent: torch.Tensor) -> bool:
    """``held`` (the rollout's copy, possibly wider) is ``sent`` exactly: ``sent`` widened to
    ``held``'s dtype equals it, and ``held`` in ``sent``'s dtype has ``sent``'s bit pattern."""
    if held.shape != sent.shape:
        return False
    if held.dtype != sent.dtype and not torch.equal(held, sent.to(held.dtype)):
        return False
    a, b = held.to(sent.dtype).contiguous(), sent.contiguous()
    as_int = _INT_OF_WIDTH[sent.element_size()]
    return torch.equal(a.reshape(-1).view(as_int), b.reshape(-1).view(as_int))


_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def sync_report(model, pushed: dict[str, torch.Tensor], digest: str | None = None) -> dict:
    """Every tensor the rollout's ranks loaded, gathered back, vs what was pushed (bitwise; the
    rollout may hold a tensor in a wider dtype than it was sent in: ``_same_bits``). ``digest``:
    the ``weights_digest`` of what the rollout holds, each tensor in the dtype it was pushed in:
    the pushed weights' (``digest``, when given) when every tensor arrived bit for bit, else
    hashed from the gathered tensors. ``adapter_digest``: the ``weights_digest`` of the LoRA
    adapter the rollout serves (its gathered A, B and alpha, in the dtypes it holds them in),
    always hashed here from what it holds, never taken from the push (None: it serves none):
    the handshake the trainer checks against the adapter it pushed."""
    from ..adapters.common.lora import split_adapter

    gathered, problems = model.gathered_weights()
    served = split_adapter(gathered)[1]
    adapter_digest = weights_digest(served) if served else None
    mismatched = sorted(  # compared where the rollout holds them (the push copied there)
        name
        for name, value in pushed.items()
        if name not in gathered
        or not _same_bits(gathered[name], value.to(gathered[name].device, non_blocking=True))
    )
    synced = not mismatched and not problems
    if not synced or digest is None:
        held = {
            name: gathered[name].to(value.dtype).cpu() if name in gathered else torch.zeros(0)
            for name, value in pushed.items()
        }
        digest = weights_digest(held)
    return {
        "synced": synced,
        "mismatched": mismatched,
        "problems": problems,
        "digest": digest,
        "adapter_digest": adapter_digest,
    }


def policies(
    contract_id: str, tp: int, dtype_override: str | None, kernel_changes, runtime_changes
):
    """(KernelPolicy, SGLang runtime policy) from the generated sglang target, faults applied."""
    from ..codegen.vendored import load_target

    gen = load_target(ROLLOUT)
    kp = gen.schema.kernel_policy_for(contract_id)
    if dtype_override is not None:
        kp = with_dtype(kp, dtype_override)
    kp = dataclasses.replace(kp, **dict(kernel_changes))
    rp = gen.runtime_policy.policy_for(contract_id, SimpleNamespace(tp_size=tp))
    rp = dataclasses.replace(rp, **dict(runtime_changes))
    return gen, kp, rp


def model_arch(contract_id: str, weights: Any):
    """(arch, HF state dict) for the contract's reference model or a checkpoint directory."""
    from .targets import rollout_adapter

    load_checkpoint, ModelArch = rollout_adapter().load_checkpoint, rollout_adapter().ModelArch
    from ..codegen.vendored import load_target

    profile = load_target(ROLLOUT).schema.model_profile_for(contract_id)
    if isinstance(weights, (str, os.PathLike)):
        return load_checkpoint(weights, profile)
    return ModelArch.from_profile(profile), weights


def arch_of(contract_id: str, weights: Any):
    """The ``ModelArch`` alone: for a checkpoint directory from its ``config.json`` (the coverage
    check included), without reading its weights as ``model_arch`` does."""
    if isinstance(weights, (str, os.PathLike)):
        from .targets import rollout_adapter

        check_checkpoint, ModelArch = (
            rollout_adapter().check_checkpoint,
            rollout_adapter().ModelArch,
        )
        from ..codegen.vendored import load_target

        profile = load_target(ROLLOUT).schema.model_profile_for(contract_id)
        return ModelArch.from_profile(profile, check_checkpoint(weights, profile))
    return model_arch(contract_id, weights)[0]


def _prompts(workload: Sequence[PromptSpec], vocab_size: int) -> list[list[int]]:
    """Each request's prompt: its own ``prompt_ids``, or ids drawn from one seeded generator."""
    g = torch.Generator().manual_seed(1234)
    drawn = [torch.randint(0, vocab_size, (w.prompt_len,), generator=g).tolist() for w in workload]
    return [list(w.prompt_ids) if w.prompt_ids else d for w, d in zip(workload, drawn, strict=True)]


def requests_for(workload: Sequence[PromptSpec], vocab_size: int) -> list:
    """The engine's ``Request`` of every prompt of ``workload`` (its seeded prompt ids)."""
    from .targets import rollout_adapter

    Request = rollout_adapter().Request

    prompts = _prompts(workload, vocab_size)
    return [
        Request(
            w.rid,
            tuple(p),
            w.max_new_tokens,
            w.temperature,
            w.seed,
            w.arrival_step,
            top_k=w.top_k,
            top_p=w.top_p,
        )
        for w, p in zip(workload, prompts, strict=True)
    ]


def _run(job: RolloutJob, group=None, device: str | None = None) -> RolloutResult:
    from ..adapters.kernels.audit import maybe_recording
    from ..adapters.kernels.planted import planted

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


def _run_unplanted(job: RolloutJob, group=None, device: str | None = None) -> RolloutResult:
    from .targets import rollout_adapter

    RolloutEngine, ReferenceModel = (
        rollout_adapter().RolloutEngine,
        rollout_adapter().ReferenceModel,
    )

    _, kp, rp = policies(
        job.contract_id, job.tp, job.dtype_override, job.kernel_changes, job.runtime_changes
    )
    sync, times = None, {}
    if job.weight_sync is not None:
        t0 = time.perf_counter()
        rank = dist.get_rank(group) if group is not None else 0
        arch = job.arch if job.arch is not None else model_arch(job.contract_id, {})[0]
        update = _update(job, rank, job.tp)
        engine = _held_engine(job, kp, rp, arch, group, device, update)
        times["load"] = _synced_clock(device) - t0
        pushed = pushed_weights(job.weights)
        sync = sync_report(engine.model, pushed, job.weight_sync.digest)
        times["sync_check"] = time.perf_counter() - t0 - times["load"]
    else:
        arch, weights = model_arch(job.contract_id, job.weights)
        model = ReferenceModel(arch, weights, kp, rp, group=group, device=device)
        engine = RolloutEngine(model, progress=False)
    if job.rescore_only is not None:
        return _rescore_only(engine, job.rescore_only)
    requests = requests_for(job.workload, arch.vocab_size)
    params = [r.sampling for r in requests]
    t0 = time.perf_counter()
    done = engine.generate(requests)
    t1 = time.perf_counter()
    sequences, prompt_lens, decode_lp, prefill_lp, dumps = [], [], [], [], []
    # one packed prefill re-scores every finished sequence (per sequence when dumping layers)
    packed = None if job.dump_layers else engine.rescore_many([done[w.rid].sequence for w in job.workload], params)  # fmt: skip
    for i, w in enumerate(job.workload):
        c = done[w.rid]
        outputs: list | None = [] if job.dump_layers else None
        rescored = packed[i] if packed is not None else engine.rescore(c.sequence, layer_outputs=outputs, params=params[i])  # fmt: skip
        sequences.append(c.sequence)
        prompt_lens.append(len(c.prompt))
        decode_lp.append(c.logprob_tensor().cpu())
        prefill_lp.append(rescored[len(c.prompt) - 1 :].cpu())
        if outputs is not None:
            dumps.append([o.cpu() for o in outputs])
    t2 = time.perf_counter()
    return RolloutResult(
        sequences, prompt_lens, decode_lp, prefill_lp, t1 - t0, t2 - t1,
        dumps if job.dump_layers else None,
        {} if sync is None else {"weight_sync": sync, "time_s": times},
        sampling=params,
    )  # fmt: skip


def _synced_clock(device: str | None) -> float:
    """``time.perf_counter()`` once ``device``'s queued work is done."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


# torch.distributed backend and per-rank device for each --device choice
BACKENDS = {"cpu": ("gloo", lambda rank: None), "cuda": ("nccl", lambda rank: f"cuda:{rank}")}


def _worker(rank: int, commands, results, tp: int, device: str, port: int) -> None:
    """One TP rank: runs every job it is sent until it receives None."""
    import traceback

    import torch.distributed as dist

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
            f"rollout session (TP={tp})", tp, _worker, self._start_args,
            device=device, timeout_s=timeout_s,
        )  # fmt: skip

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
            from ..adapters.common.memory import release_free_memory

            try:
                return _run(job)
            finally:
                release_free_memory()
        replies = self._pool.send(job, "rollout")
        result = replies[0][1]
        if job.kernel_audit is not None:  # every rank's calls, not rank 0's alone
            from ..adapters.kernels.audit import merge

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
        contract_id, weights, tp, tuple(workload), dtype_override,
        dict(kernel_changes or {}), dict(runtime_changes or {}), dump_layers, device,
    )  # fmt: skip
    with RolloutSession(tp, device) as session:
        return session.run(job)
