"""The trainer-side forward the parity gate calls: per-token logprobs on real megatron-core.

``trainer_logprobs`` spawns ``tp * pp * cp`` gloo processes (CPU) that each build their
megatron-core model stage (``SGLangGPTModel``), load the same weights as the rollout (HF
checkpoint directory or in-memory HF state dict), pack the sequences into one row, run the
forward (``pipeline.pipeline_forward``) and compute logprobs with SGLang's log-softmax kernel.
Results come back to the caller as plain tensors.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .model import Layout, arch_for, load_checkpoint

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


@dataclass(frozen=True)
class TrainerRun:
    """One forward variant; several share one set of spawned processes (``trainer_logprobs_runs``)."""

    dtype_override: str | None = None
    fault: TrainerFault | None = None
    prefix_tree: bool = False
    prompt_lens: tuple[int, ...] | None = None
    dump_layers: bool = False
    grads: bool = False
    """Training step instead: loss = summed next-token cross-entropy (megatron-core's
    ``vocab_parallel_cross_entropy``) of each rank's tokens, backward, ``grads.finalize_grads``;
    the result's ``grads`` holds global rank 0's parameter gradients (first stage, TP/CP rank 0)."""


@dataclass(frozen=True)
class _Job:
    contract_id: str
    weights: dict[str, torch.Tensor]  # HF names
    sequences: list[list[int]]
    layout: Layout
    arch: Any  # contractgen.adapters.sglang.model.ModelArch
    runs: tuple[TrainerRun, ...]
    device: str
    port: int
    out_dir: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def trainer_logprobs(
    contract_id: str,
    weights_or_checkpoint: Mapping[str, torch.Tensor] | str | os.PathLike[str],
    sequences: Sequence[Sequence[int]],
    layout: Layout | tuple[int, int, int] = (1, 1, 1),
    *,
    dtype_override: str | None = None,
    device: str = "cpu",
    fault: TrainerFault | None = None,
    prompt_lens: Sequence[int] | None = None,
    prefix_tree: bool = False,
    dump_layers: bool = False,
    arch: Any = None,
) -> TrainerResult:
    """Megatron-core forward logprobs of ``sequences`` (token-id lists) at ``layout``.

    ``weights_or_checkpoint``: an HF-named state dict (the rollout's random weights) or an HF
    checkpoint directory. ``layout``: ``Layout(tp, pp, cp)`` or a ``(tp, pp, cp)`` tuple.
    ``dtype_override="float32"`` sets every KernelPolicy dtype to float32 (diagnostic mode).
    ``fault`` flips runtime-policy / KernelPolicy fields on this side only.
    ``prefix_tree=True`` (with ``prompt_lens``) packs sequences sharing a prompt as a tree.
    ``dump_layers=True`` also returns every layer's residual stream per sequence.
    """
    run = TrainerRun(
        dtype_override=dtype_override,
        fault=fault,
        prefix_tree=prefix_tree,
        prompt_lens=tuple(prompt_lens) if prompt_lens is not None else None,
        dump_layers=dump_layers,
    )
    return trainer_logprobs_runs(
        contract_id, weights_or_checkpoint, sequences, layout, [run], device=device, arch=arch
    )[0]


def trainer_logprobs_runs(
    contract_id: str,
    weights_or_checkpoint: Mapping[str, torch.Tensor] | str | os.PathLike[str],
    sequences: Sequence[Sequence[int]],
    layout: Layout | tuple[int, int, int],
    runs: Sequence[TrainerRun],
    *,
    device: str = "cpu",
    arch: Any = None,
) -> list[TrainerResult]:
    """Like ``trainer_logprobs`` for several variants (e.g. every injected fault) in one set of
    spawned processes: one ``TrainerResult`` per run, in order."""
    if not isinstance(layout, Layout):
        layout = Layout(*layout)
    if device not in BACKENDS:
        raise ValueError(f"device={device!r}: expected one of {sorted(BACKENDS)}")
    if device == "cuda" and torch.cuda.device_count() < layout.world_size:
        raise RuntimeError(
            f"layout {layout.name} needs {layout.world_size} CUDA devices, "
            f"{torch.cuda.device_count()} visible"
        )
    if isinstance(weights_or_checkpoint, str | os.PathLike):
        arch, weights = load_checkpoint(contract_id, weights_or_checkpoint)
    else:
        arch = arch if arch is not None else arch_for(contract_id)
        weights = {k: v.detach().cpu() for k, v in weights_or_checkpoint.items()}
    with tempfile.TemporaryDirectory(prefix="contractgen-megatron-") as out_dir:
        job = _Job(
            contract_id=contract_id,
            weights=weights,
            sequences=[[int(t) for t in s] for s in sequences],
            layout=layout,
            arch=arch,
            runs=tuple(runs),
            device=device,
            port=_free_port(),
            out_dir=out_dir,
        )
        run_spawned(job)
        results: list[TrainerResult] = torch.load(Path(out_dir) / "result.pt", weights_only=False)
        for i, res in enumerate(results):
            if job.runs[i].dump_layers:
                res.layer_dumps = _merge_dumps(Path(out_dir), i, layout.pp)
        return results


def _merge_dumps(out_dir: Path, run: int, pp: int) -> list[dict[str, torch.Tensor]]:
    merged: list[dict[str, torch.Tensor]] | None = None
    for stage in range(pp):
        part = torch.load(out_dir / f"dumps-{run}-pp{stage}.pt", weights_only=False)
        if merged is None:
            merged = part
        else:
            for a, b in zip(merged, part, strict=True):
                a.update(b)
    return merged or []


def run_spawned(job: _Job) -> None:
    """Run ``_worker`` in ``world_size`` spawned processes (gloo); raises if any fails."""
    import torch.multiprocessing as mp

    mp.start_processes(
        _worker, args=(job,), nprocs=job.layout.world_size, join=True, start_method="spawn"
    )


def _worker(rank: int, job: _Job) -> None:
    from . import runtime

    torch.set_num_threads(1)
    runtime.init_distributed(rank, job.layout, job.port, job.device)
    try:
        results = []
        for i, run in enumerate(job.runs):
            step = runtime.stage_grads if run.grads else runtime.stage_logprobs
            result, dumps = step(job, run)
            results.append(result)
            if dumps is not None:
                torch.save(dumps, Path(job.out_dir) / f"dumps-{i}-pp{runtime.pp_rank()}.pt")
        if results[0] is not None:
            torch.save(results, Path(job.out_dir) / "result.pt")
    finally:
        runtime.shutdown()


def with_fault(policy: Any, changes: Mapping[str, Any]) -> Any:
    """``dataclasses.replace`` with a clear error for a misspelt field."""
    names = {f.name for f in dataclasses.fields(policy)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise ValueError(
            f"{type(policy).__name__} has no field(s) {unknown}; fields: {sorted(names)}"
        )
    return dataclasses.replace(policy, **changes)
