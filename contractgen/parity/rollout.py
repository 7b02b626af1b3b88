"""The rollout side of the gate: the reference rollout at a TP size, with optional faults.

TP=1 runs in this process; TP>1 spawns one gloo process per rank (every rank samples the same
tokens from identical gathered logits; rank 0 reports). Policies come from the generated sglang
target only.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

DTYPE_FIELDS_SUFFIX = "_dtype"


@dataclass(frozen=True)
class PromptSpec:
    """One request of the gate's workload (token ids are drawn from the model's vocab)."""

    rid: str
    prompt_len: int
    max_new_tokens: int
    temperature: float
    seed: int
    arrival_step: int


# Several concurrent requests of different lengths, joining and finishing at different steps,
# greedy and seeded sampling.
DEFAULT_WORKLOAD = (
    PromptSpec("r0", 5, 6, 0.0, 0, 0),
    PromptSpec("r1", 11, 4, 0.8, 1, 0),
    PromptSpec("r2", 17, 7, 0.0, 2, 1),
    PromptSpec("r3", 8, 5, 1.0, 3, 2),
)


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


@dataclass(frozen=True)
class RolloutJob:
    contract_id: str
    weights: Any  # HF state dict or checkpoint path
    tp: int
    workload: tuple[PromptSpec, ...]
    dtype_override: str | None
    kernel_changes: Mapping[str, Any]
    runtime_changes: Mapping[str, Any]
    dump_layers: bool
    port: int = 0
    out_dir: str = ""


def policies(
    contract_id: str, tp: int, dtype_override: str | None, kernel_changes, runtime_changes
):
    """(KernelPolicy, SGLang runtime policy) from the generated sglang target, faults applied."""
    from ..vendored import load_target

    gen = load_target("sglang")
    kp = gen.schema.kernel_policy_for(contract_id)
    if dtype_override is not None:
        kp = dataclasses.replace(
            kp,
            **{
                f.name: dtype_override
                for f in dataclasses.fields(kp)
                if f.name.endswith(DTYPE_FIELDS_SUFFIX)
            },
        )
    kp = dataclasses.replace(kp, **dict(kernel_changes))
    rp = gen.runtime_policy.policy_for(contract_id, SimpleNamespace(tp_size=tp))
    rp = dataclasses.replace(rp, **dict(runtime_changes))
    return gen, kp, rp


def model_arch(contract_id: str, weights: Any):
    """(arch, HF state dict) for the contract's reference model or a checkpoint directory."""
    from ..adapters.sglang.checkpoint import load_checkpoint
    from ..adapters.sglang.model import ModelArch
    from ..vendored import load_target

    profile = load_target("sglang").schema.model_profile_for(contract_id)
    if isinstance(weights, (str, os.PathLike)):
        return load_checkpoint(weights, profile)
    return ModelArch.from_profile(profile), weights


def _prompts(workload: Sequence[PromptSpec], vocab_size: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab_size, (w.prompt_len,), generator=g).tolist() for w in workload]


def _run(job: RolloutJob, group=None) -> RolloutResult:
    from ..adapters.sglang.engine import Request, RolloutEngine
    from ..adapters.sglang.model import ReferenceModel

    _, kp, rp = policies(
        job.contract_id, job.tp, job.dtype_override, job.kernel_changes, job.runtime_changes
    )
    arch, weights = model_arch(job.contract_id, job.weights)
    model = ReferenceModel(arch, weights, kp, rp, group=group)
    engine = RolloutEngine(model, progress=False)
    prompts = _prompts(job.workload, arch.vocab_size)
    requests = [
        Request(w.rid, tuple(p), w.max_new_tokens, w.temperature, w.seed, w.arrival_step)
        for w, p in zip(job.workload, prompts, strict=True)
    ]
    t0 = time.perf_counter()
    done = engine.generate(requests)
    t1 = time.perf_counter()
    sequences, prompt_lens, decode_lp, prefill_lp, dumps = [], [], [], [], []
    for w in job.workload:
        c = done[w.rid]
        seq = c.sequence
        outputs: list | None = [] if job.dump_layers else None
        rescored = engine.rescore(seq, layer_outputs=outputs)
        sequences.append(seq)
        prompt_lens.append(len(c.prompt))
        decode_lp.append(c.logprob_tensor())
        prefill_lp.append(rescored[len(c.prompt) - 1 :])
        if outputs is not None:
            dumps.append(outputs)
    t2 = time.perf_counter()
    return RolloutResult(
        sequences, prompt_lens, decode_lp, prefill_lp, t1 - t0, t2 - t1,
        dumps if job.dump_layers else None,
    )  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, job: RolloutJob) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(job.port)
    dist.init_process_group("gloo", rank=rank, world_size=job.tp)
    try:
        result = _run(job, group=dist.group.WORLD)
        if rank == 0:
            torch.save(result, Path(job.out_dir) / "rollout.pt")
    finally:
        dist.destroy_process_group()


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
) -> RolloutResult:
    """Generate the workload and re-score every finished sequence at rollout TP ``tp``."""
    job = RolloutJob(
        contract_id, weights, tp, tuple(workload), dtype_override,
        dict(kernel_changes or {}), dict(runtime_changes or {}), dump_layers,
    )  # fmt: skip
    if tp == 1:
        return _run(job)
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="contractgen-rollout-") as out:
        job = dataclasses.replace(job, port=_free_port(), out_dir=out)
        mp.start_processes(_worker, args=(job,), nprocs=tp, join=True, start_method="spawn")
        return torch.load(Path(out) / "rollout.pt", weights_only=False)
