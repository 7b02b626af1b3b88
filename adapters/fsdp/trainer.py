"""The FSDP trainer the parity gate calls: ``TrainerSession`` (``ROLE_API["trainer"]``).

A session spawns ``layout.fsdp`` ranks (gloo on CPU, NCCL on CUDA, one GPU per rank) from the
project's rank pool (``adapters.common.workers``) that keep running across calls; each call builds the
sharded model afresh under the run's policies (milliseconds for the tiny models), so faults never
leak between runs. Weights come as one shared-memory buffer (``SharedTensors``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..common.distributed import Rendezvous
from ..common.layout import Layout, LayoutError
from ..common.run_types import (
    BACKENDS,
    TrainBatch,
    TrainerResult,
    TrainerRun,
    TrainInit,
    TrainStepResult,
)
from ..common.shared_tensors import SharedTensors
from ..common.workers import RankPool, TrainerJob


def fsdp_ranks(layout: Layout) -> int:
    """The ranks an ``fsdpN`` layout runs; any other layout is refused (this trainer has no TP,
    PP, CP or EP: ``LAYOUT_AXES``)."""
    other = {k: v for k, v in layout.sizes.items() if k != "fsdp" and v > 1}
    if layout.fsdp < 1 or other:
        raise LayoutError(
            f"layout {layout.name}: the fsdp trainer runs fsdpN layouts only (FSDP ranks, no "
            "model parallelism), e.g. fsdp1, fsdp2, fsdp4"
        )
    return layout.fsdp


def _arch(contract_id: str, weights: Any, arch: Any) -> Any:
    """The model ``weights`` hold: a checkpoint's from its ``config.json`` (the rollout's
    coverage check), else ``arch``, else the contract's reference model."""
    from ..common.checkpoint import check_checkpoint
    from ..common.model import ModelArch
    from .policy import generated

    profile = generated().schema.model_profile_for(contract_id)
    if isinstance(weights, str | os.PathLike):
        return ModelArch.from_profile(profile, check_checkpoint(weights, profile))
    return arch if arch is not None else ModelArch.from_profile(profile)


class TrainerSession:
    """Spawned FSDP ranks kept alive across calls.

    ``with TrainerSession(contract, weights, parse_layout("fsdp2")) as s: s.logprobs(seqs)``.
    """

    def __init__(
        self,
        contract_id: str,
        weights_or_checkpoint: Mapping[str, torch.Tensor] | str | os.PathLike[str],
        layout: Layout,
        *,
        device: str = "cpu",
        arch: Any = None,
        timeout_s: float = 900.0,
    ) -> None:
        world = fsdp_ranks(layout)
        if device not in BACKENDS:
            raise ValueError(f"device={device!r}: expected one of {sorted(BACKENDS)}")
        if device == "cuda" and torch.cuda.device_count() < world:
            raise RuntimeError(
                f"layout {layout.name} needs {world} CUDA devices, "
                f"{torch.cuda.device_count()} visible"
            )
        arch = _arch(contract_id, weights_or_checkpoint, arch)
        if isinstance(weights_or_checkpoint, str | os.PathLike):
            from ..common.checkpoint import safetensors_files

            shared = SharedTensors.from_safetensors(safetensors_files(weights_or_checkpoint))
        else:
            shared = SharedTensors.pack(weights_or_checkpoint)
        self.layout, self.timeout_s = layout, timeout_s
        self._job = TrainerJob(contract_id, shared, [], layout, arch, device, port=0)
        self._pool = RankPool(
            f"fsdp trainer session ({layout.name})", world, _session_worker, self._start_args,
            device=device, timeout_s=timeout_s,
        )  # fmt: skip

    def _start_args(self) -> tuple:
        """The ranks' job, joined at a rendezvous this session serves (one per pool start)."""
        self._rendezvous = Rendezvous()
        return (dataclasses.replace(self._job, port=self._rendezvous.port),)

    def __enter__(self) -> TrainerSession:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> None:
        self._pool.start()

    def logprobs(self, sequences: Sequence[Sequence[int]], run: TrainerRun | None = None):
        """One forward of ``sequences`` (each rank scores its share; merged here), or with
        ``run.grads`` one backward (``runtime.backward_grads``: rank 0's full gradients)."""
        run = run or TrainerRun()
        seqs = [[int(t) for t in seq] for seq in sequences]
        replies = self._pool.send((seqs, run), "fsdp trainer forward")
        if run.grads:  # rank 0 answers with every full gradient (runtime.backward_grads)
            return replies[0][1]
        results = [p[1] for _, p in sorted(replies.items()) if p[1] is not None]
        merged = TrainerResult(
            logprobs=[
                next(r.logprobs[i] for r in results if r.logprobs[i] is not None)
                for i in range(len(seqs))
            ]
        )
        if run.dump_layers:
            merged.layer_dumps = next(p[2] for _, p in sorted(replies.items()) if p[2])
        if run.kernel_audit is not None:
            from ..kernels.audit import merge

            merged.kernel_calls = merge({r: p[3] for r, p in replies.items()})
        return merged

    def train(self, command: TrainInit | TrainBatch) -> TrainStepResult:
        """Set up training (``TrainInit``: the ranks keep the sharded model and AdamW) or take
        one step (``TrainBatch``, ``training.py``); rank 0's reply carries the result and the
        full state dict for the push."""
        replies = self._pool.send(command, "fsdp trainer step")
        return replies[0][1]

    def close(self) -> None:
        self._pool.close()


def _session_worker(rank: int, commands: Any, results: Any, job: TrainerJob) -> None:
    import traceback

    from . import runtime

    torch.set_num_threads(1)
    if isinstance(job.weights, SharedTensors):
        job = dataclasses.replace(job, weights=job.weights.tensors())
    try:
        me = runtime.init_distributed(rank, job.layout.fsdp, job.port, job.device)
    except Exception:
        results.put((rank, "err", traceback.format_exc(), None, None))
        return
    state = None  # training state (sharded model + AdamW), built by a TrainInit, kept
    try:
        while (command := commands.get()) is not None:
            try:
                from ..kernels.audit import maybe_recording
                from ..kernels.planted import planted

                if isinstance(command, TrainInit | TrainBatch):
                    from . import training

                    if isinstance(command, TrainInit):
                        state = training.init_state(job, command, me)
                        result = TrainStepResult(weights=training.full_weights(state, job, me))
                    elif state is None:
                        raise RuntimeError("TrainBatch before TrainInit")
                    else:
                        result = training.train_step(state, job, command, me)
                    results.put((rank, "ok", result, None, None))
                    continue
                sequences, run = command
                with planted(run.planted_bugs), maybe_recording(run.kernel_audit) as calls:
                    here = dataclasses.replace(job, sequences=sequences)
                    if run.grads:
                        result, dumps = runtime.backward_grads(here, run, me), None
                    else:
                        result, dumps = runtime.forward_logprobs(here, run, me)
                results.put((rank, "ok", result, dumps, calls))
            except Exception:
                results.put((rank, "err", traceback.format_exc(), None, None))
    finally:
        runtime.shutdown()
