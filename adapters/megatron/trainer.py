"""The trainer-side forward the parity gate calls: per-token logprobs on real megatron-core.

``trainer_logprobs`` spawns ``Layout.world_size`` gloo processes on CPU (``tp * pp * cp``, times
the attention DP an EP layout needs) that each build their megatron-core model stage
(``SGLangGPTModel``), load the same weights as the rollout (HF checkpoint directory or in-memory
HF state dict), pack the sequences into one row (each DP rank its share), run the forward
(``pipeline.pipeline_forward``) and compute logprobs with SGLang's log-softmax kernel. Results
come back to the caller as plain tensors.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..common.checkpoint import safetensors_files
from ..common.distributed import Rendezvous
from ..common.layout import Layout
from ..common.run_types import (
    BACKENDS,
    TrainBatch,
    TrainerFault,
    TrainerResult,
    TrainerRun,
    TrainInit,
    TrainStepResult,
    with_fault,
)
from ..common.shared_tensors import SharedTensors
from ..common.workers import RankPool, TrainerJob
from .profile import arch_for, checkpoint_arch

__all__ = [
    "BACKENDS",
    "TrainerFault",
    "TrainerResult",
    "TrainerRun",
    "TrainerSession",
    "trainer_logprobs",
    "trainer_logprobs_runs",
    "with_fault",
]


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
    with TrainerSession(contract_id, weights_or_checkpoint, layout, device=device, arch=arch) as s:
        return [s.logprobs(sequences, run) for run in runs]


class TrainerSession:
    """Spawned trainer processes kept alive across calls (spawning and importing megatron-core
    costs seconds per call; building a tiny model costs milliseconds).

    ``with TrainerSession(contract, weights, (tp, pp, cp)) as s: s.logprobs(seqs, TrainerRun())``.
    Each call builds the stage afresh under the run's policies, so runs never leak into each other.
    """

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
        if device not in BACKENDS:
            raise ValueError(f"device={device!r}: expected one of {sorted(BACKENDS)}")
        if device == "cuda" and torch.cuda.device_count() < layout.world_size:
            raise RuntimeError(
                f"layout {layout.name} needs {layout.world_size} CUDA devices, "
                f"{torch.cuda.device_count()} visible"
            )
        # one shared buffer (one descriptor) for the ranks, any model size; a checkpoint is read
        # into it tensor by tensor, never held as a private state dict here as well
        if isinstance(weights_or_checkpoint, str | os.PathLike):
            arch = checkpoint_arch(contract_id, weights_or_checkpoint)
            shared = SharedTensors.from_safetensors(safetensors_files(weights_or_checkpoint))
        else:
            arch = arch if arch is not None else arch_for(contract_id)
            shared = SharedTensors.pack(weights_or_checkpoint)
        self.layout, self.timeout_s = layout, timeout_s
        self._job = TrainerJob(
            contract_id=contract_id,
            weights=shared,
            sequences=[],
            layout=layout,
            arch=arch,
            device=device,
            port=0,  # the pool's rendezvous (``_start_args``)
        )
        self._pool = RankPool(
            f"trainer session ({layout.name})", layout.world_size, _session_worker, self._start_args,
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
        """One forward (or, with ``run.grads``, one backward) of ``sequences``."""
        run = run or TrainerRun()
        seqs = [[int(t) for t in seq] for seq in sequences]
        replies = self._send((seqs, run), "trainer forward")
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
            from ..kernels.audit import merge

            result.kernel_calls = merge({r: p[4] for r, p in replies.items()})
        return result

    def train(self, command: TrainInit | TrainBatch) -> TrainStepResult:
        """Set up training (``TrainInit``: the ranks keep the stage and its optimizer) or take
        one step (``TrainBatch``); the ranks' parts of the result merged."""
        replies = self._send(command, "trainer step")
        merged = TrainStepResult()
        parts = []  # each stage's weights (``gather.gather_weights``), in rank order
        for _, reply in sorted(replies.items()):
            part = reply[1]
            if part.weights is not None:
                parts.append(part.weights)
            for f in dataclasses.fields(part):
                if getattr(part, f.name) is not None and getattr(merged, f.name) is None:
                    setattr(merged, f.name, getattr(part, f.name))
        if len(parts) > 1:  # pipeline stages: one buffer (a tied head's copy: the first stage's)
            whole: dict[str, torch.Tensor] = {}
            for part in parts:
                for name, value in part.tensors().items():
                    whole.setdefault(name, value)
            merged.weights = SharedTensors.pack(whole)
        return merged

    def _send(self, command: Any, what: str) -> dict[int, tuple]:
        return self._pool.send(command, what)

    def close(self) -> None:
        self._pool.close()


def _session_worker(rank: int, commands: Any, results: Any, job: TrainerJob) -> None:
    import traceback

    from . import runtime

    torch.set_num_threads(1)
    if isinstance(job.weights, SharedTensors):
        job = dataclasses.replace(job, weights=job.weights.tensors())
    try:
        runtime.init_distributed(rank, job.layout, job.port, job.device)
    except Exception:
        results.put((rank, "err", traceback.format_exc(), None, None))
        return
    state = None  # training state (stage + optimizer), built by a TrainInit, kept across steps
    try:
        while (command := commands.get()) is not None:
            try:
                if isinstance(command, TrainInit | TrainBatch):
                    from . import training  # heavy: megatron-core's optimizer, in ranks only
                    from .gather import gather_weights

                    if isinstance(command, TrainInit):
                        state = training.init_state(job, command)
                        result = TrainStepResult(
                            weights=gather_weights(state, job),
                            trained=training.trained_counts(state),
                        )
                    elif state is None:
                        raise RuntimeError("TrainBatch before TrainInit")
                    else:
                        result = training.train_step(state, job, command)
                    results.put((rank, "ok", result, None, runtime.pp_rank()))
                    continue
                sequences, run = command
                from contractgen.adapters.kernels.planted import planted

                step = runtime.stage_grads if run.grads else runtime.stage_logprobs
                from contractgen.adapters.kernels.audit import maybe_recording

                with planted(run.planted_bugs), maybe_recording(run.kernel_audit) as calls:
                    result, dumps = step(dataclasses.replace(job, sequences=sequences), run)
                results.put((rank, "ok", result, dumps, runtime.pp_rank(), calls))
            except Exception:
                results.put((rank, "err", traceback.format_exc(), None, None))
    finally:
        runtime.shutdown()
