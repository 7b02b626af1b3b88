"""The trainer session every trainer target runs behind (``ROLE_API["trainer"]``), and its ranks'
command loop.

A session spawns a layout's ranks from the project's rank pool (``workers.RankPool``), hands them
the weights as one shared-memory buffer (``SharedTensors``: a checkpoint is read into it tensor
by tensor) and keeps them running across calls; each call builds the model afresh under the run's
policies (milliseconds for the tiny models), so runs never leak into each other. The ranks join a
rendezvous the session serves (``distributed.Rendezvous``, one per pool start).

What is a target's own comes in as its ``roles.TrainerRanks`` (a class of static functions,
pickled by name to the ranks): how many ranks a layout runs, where the contract's model profile
is, and in the ranks how a rank joins its groups, scores or backpropagates sequences, and sets up
and takes a training step. The target's ``TrainerSession`` is this class with its ``ranks`` set.
"""

from __future__ import annotations

import dataclasses
import os
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..kernels.audit import maybe_recording, merge
from ..kernels.planted import planted
from .checkpoint import check_checkpoint, safetensors_files
from .distributed import Rendezvous
from .layout import Layout
from .model import ModelArch
from .roles import TrainerRanks
from .run_types import BACKENDS, TrainBatch, TrainerResult, TrainerRun, TrainInit, TrainStepResult
from .shared_tensors import SharedTensors
from .workers import RankPool, TrainerJob


class TrainerSession:
    """A trainer target's ranks for one layout, kept alive across calls (spawning and importing a
    trainer library costs seconds per call; building a tiny model costs milliseconds).

    ``with Session(contract, weights, layout) as s: s.logprobs(seqs, TrainerRun())``, where
    ``Session`` is a target's subclass naming its ``ranks``.
    """

    ranks: type[TrainerRanks]

    def __init__(
        self,
        contract_id: str,
        weights_or_checkpoint: Mapping[str, torch.Tensor] | str | os.PathLike[str],
        layout: Layout | tuple[int, int, int] = (1, 1, 1),
        *,
        device: str = "cpu",
        arch: Any = None,
        timeout_s: float = 900.0,
    ) -> None:
        if not isinstance(layout, Layout):
            layout = Layout(*layout)
        world = self.ranks.world_size(layout)
        if device not in BACKENDS:
            raise ValueError(f"device={device!r}: expected one of {sorted(BACKENDS)}")
        if device == "cuda" and torch.cuda.device_count() < world:
            raise RuntimeError(
                f"layout {layout.name} needs {world} CUDA devices, "
                f"{torch.cuda.device_count()} visible"
            )
        # one shared buffer (one descriptor) for the ranks, any model size; a checkpoint is read
        # into it tensor by tensor, never held as a private state dict here as well
        profile = self.ranks.model_profile(contract_id)
        if isinstance(weights_or_checkpoint, str | os.PathLike):
            arch = ModelArch.from_profile(profile, check_checkpoint(weights_or_checkpoint, profile))
            shared = SharedTensors.from_safetensors(safetensors_files(weights_or_checkpoint))
        else:
            arch = arch if arch is not None else ModelArch.from_profile(profile)
            shared = SharedTensors.pack(weights_or_checkpoint)
        self.layout, self.timeout_s = layout, timeout_s
        self._name = self.ranks.name
        self._job = TrainerJob(contract_id, shared, [], layout, arch, device, port=0)
        self._pool = RankPool(
            f"{self._name} session ({layout.name})",
            world,
            rank_loop,
            self._start_args,
            device=device,
            timeout_s=timeout_s,
        )

    def _start_args(self) -> tuple:
        """The ranks' job, joined at a rendezvous this session serves (one per pool start)."""
        self._rendezvous = Rendezvous()
        return (dataclasses.replace(self._job, port=self._rendezvous.port), self.ranks)

    def __enter__(self) -> TrainerSession:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> None:
        self._pool.start()

    def logprobs(self, sequences: Sequence[Sequence[int]], run: TrainerRun | None = None):
        """One forward (or, with ``run.grads``, one backward) of ``sequences``: the first
        answering rank's result, with every sequence's logprobs from the rank that scored it,
        the layer dumps of every pipeline stage and every rank's kernel calls merged in."""
        run = run or TrainerRun()
        seqs = [[int(t) for t in seq] for seq in sequences]
        replies = self._pool.send((seqs, run), f"{self._name} forward")
        results = [p[1] for _, p in sorted(replies.items()) if p[1] is not None]
        result: TrainerResult = results[0]
        if len(results) > 1 and not run.grads:  # data-parallel ranks: each scored its share
            result.logprobs = [
                next(r.logprobs[i] for r in results if r.logprobs[i] is not None)
                for i in range(len(seqs))
            ]
        if run.dump_layers:
            merged: list[dict[str, torch.Tensor]] = []
            for _, p in sorted(replies.items(), key=lambda kv: (kv[1][3] or 0)):
                dumps = p[2]
                if dumps is None:
                    continue
                if not merged:
                    merged = [dict(d) for d in dumps]
                else:
                    for a, b in zip(merged, dumps, strict=True):
                        a.update(b)
            result.layer_dumps = merged
        if run.kernel_audit is not None:  # every rank's calls (most ranks return no result)
            result.kernel_calls = merge({r: p[4] for r, p in replies.items()})
        return result

    def train(self, command: TrainInit | TrainBatch) -> TrainStepResult:
        """Set up training (``TrainInit``: the ranks keep the model and its optimizer) or take
        one step (``TrainBatch``): each field from the first rank (in rank order) that reports
        it; weights from several ranks (pipeline stages) in one buffer, a name's first copy kept
        (a tied head's: the first stage's)."""
        replies = self._pool.send(command, f"{self._name} step")
        merged = TrainStepResult()
        parts = []  # each rank's weights, in rank order
        for _, reply in sorted(replies.items()):
            part = reply[1]
            if part.weights is not None:
                parts.append(part.weights)
            for f in dataclasses.fields(part):
                if getattr(part, f.name) is not None and getattr(merged, f.name) is None:
                    setattr(merged, f.name, getattr(part, f.name))
        if len(parts) > 1:
            whole: dict[str, torch.Tensor] = {}
            for part in parts:
                for name, value in part.tensors().items():
                    whole.setdefault(name, value)
            merged.weights = SharedTensors.pack(whole)
        return merged

    def close(self) -> None:
        self._pool.close()


def rank_loop(
    rank: int, commands: Any, results: Any, job: TrainerJob, ranks: type[TrainerRanks]
) -> None:
    """One rank of a session: join the groups, then answer commands until ``None``. A forward
    replies ``(rank, "ok", result, dumps, order, kernel calls)``, a training command ``(rank,
    "ok", TrainStepResult, None, order, None)``, a failure ``(rank, "err", traceback, ...)``."""
    torch.set_num_threads(1)
    if isinstance(job.weights, SharedTensors):
        job = dataclasses.replace(job, weights=job.weights.tensors())
    try:
        place = ranks.join(rank, job)
    except Exception:
        results.put((rank, "err", traceback.format_exc(), None, None))
        return
    state = None  # training state (model + optimizer), built by a TrainInit, kept across steps
    try:
        while (command := commands.get()) is not None:
            try:
                if isinstance(command, TrainInit):
                    state, result = ranks.train_init(job, command, place)
                    results.put((rank, "ok", result, None, ranks.order(place), None))
                    continue
                if isinstance(command, TrainBatch):
                    if state is None:
                        raise RuntimeError("TrainBatch before TrainInit")
                    result = ranks.train_step(state, job, command, place)
                    results.put((rank, "ok", result, None, ranks.order(place), None))
                    continue
                sequences, run = command
                with planted(run.planted_bugs), maybe_recording(run.kernel_audit) as calls:
                    here = dataclasses.replace(job, sequences=sequences)
                    result, dumps = ranks.logprobs(here, run, place)
                results.put((rank, "ok", result, dumps, ranks.order(place), calls))
            except Exception:
                results.put((rank, "err", traceback.format_exc(), None, None))
    finally:
        ranks.shutdown()
