"""The rollout role's data types and weight-sync check, one definition for every rollout target:
what the gate builds (``RolloutJob``, ``WeightSync``, the engine ``Request`` of each prompt) and
what a rollout answers (``RolloutResult``), plus the bitwise check of a pushed weight update
(``sync_report``, ``weights_digest``). A target's session and its ranks both import this, as the
gate does; no target is named here."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .draw import SamplingParams
from .lora import split_adapter
from .shared_tensors import SharedTensors
from .workload import DEFAULT_WORKLOAD, PromptSpec


@dataclass(frozen=True)
class Request:
    """One request a rollout engine generates (``requests_for`` builds the workload's)."""

    rid: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    temperature: float = 0.0  # 0: greedy
    seed: int = 0
    arrival_step: int = 0
    stop_token_ids: tuple[int, ...] = ()
    top_k: int = -1  # <= 0: off
    top_p: float = 1.0  # 1: off

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


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
    of one: one shared-memory buffer): each rank keeps its engine across such runs and loads the
    update into it in place, then the shards it loaded are gathered back and compared bitwise
    with ``weights`` (``RolloutResult.extra["weight_sync"]``)."""


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
    return weights.tensors() if isinstance(weights, SharedTensors) else weights


def update_for(job: RolloutJob, rank: int, tp: int) -> dict[str, torch.Tensor]:
    """The part of ``job.weights`` rank ``rank`` of ``tp`` loads (all of it but the stale-shard
    and the adapter faults')."""
    sync, pushed = job.weight_sync, pushed_weights(job.weights)
    if sync.skip_adapter:
        pushed = split_adapter(pushed)[0]
    if sync.stale is not None and not sync.reset and rank == tp - 1:
        return {name: value for name, value in pushed.items() if name != sync.stale}
    return pushed


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


def _prompts(workload: Sequence[PromptSpec], vocab_size: int) -> list[list[int]]:
    """Each request's prompt: its own ``prompt_ids``, or ids drawn from one seeded generator."""
    g = torch.Generator().manual_seed(1234)
    drawn = [torch.randint(0, vocab_size, (w.prompt_len,), generator=g).tolist() for w in workload]
    return [list(w.prompt_ids) if w.prompt_ids else d for w, d in zip(workload, drawn, strict=True)]


def requests_for(workload: Sequence[PromptSpec], vocab_size: int) -> list[Request]:
    """The ``Request`` of every prompt of ``workload`` (its seeded prompt ids): the same requests
    in every rollout target."""
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
