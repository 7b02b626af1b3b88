"""The trainer-side forward the parity gate calls: per-token logprobs on real megatron-core.

``trainer_logprobs`` spawns ``Layout.world_size`` gloo processes on CPU (``tp * pp * cp``, times
the attention DP an EP layout needs) that each build their megatron-core model stage
(``SGLangGPTModel``), load the same weights as the rollout (HF checkpoint directory or in-memory
HF state dict), pack the sequences into one row (each DP rank its share), run the forward
(``pipeline.pipeline_forward``) and compute logprobs with SGLang's log-softmax kernel. Results
come back to the caller as plain tensors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..common import trainer
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
from ..common.workers import TrainerJob
from .profile import model_profile_for

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


class MegatronRanks:
    """What the floor's session (``common.trainer``) runs of this target: ``Layout.world_size``
    ranks, each a megatron-core stage (``runtime``, ``training``); rank code imported in the
    ranks only (megatron-core: ``tests/megatron/test_light_imports.py``)."""

    name = "megatron trainer"

    @staticmethod
    def world_size(layout: Layout) -> int:
        return layout.world_size

    @staticmethod
    def model_profile(contract_id: str) -> Any:
        return model_profile_for(contract_id)

    @staticmethod
    def join(rank: int, job: TrainerJob) -> None:
        from . import runtime  # heavy: megatron-core, in ranks only

        runtime.init_distributed(rank, job.layout, job.port, job.device)

    @staticmethod
    def order(place: None) -> int:
        from . import runtime  # heavy

        return runtime.pp_rank()

    @staticmethod
    def logprobs(job: TrainerJob, run: TrainerRun, place: None) -> tuple[Any, Any]:
        from . import runtime  # heavy

        return (runtime.stage_grads if run.grads else runtime.stage_logprobs)(job, run)

    @staticmethod
    def train_init(job: TrainerJob, init: TrainInit, place: None) -> tuple[Any, TrainStepResult]:
        from . import training  # heavy: megatron-core's optimizer, in ranks only
        from .gather import gather_weights  # heavy

        state = training.init_state(job, init)
        result = TrainStepResult(
            weights=gather_weights(state, job), trained=training.trained_counts(state)
        )
        return state, result

    @staticmethod
    def train_step(state: Any, job: TrainerJob, batch: TrainBatch, place: None) -> TrainStepResult:
        from . import training  # heavy

        return training.train_step(state, job, batch)

    @staticmethod
    def shutdown() -> None:
        from . import runtime  # heavy

        runtime.shutdown()


class TrainerSession(trainer.TrainerSession):
    """megatron-core ranks kept alive across calls (``common.trainer.TrainerSession``).

    ``with TrainerSession(contract, weights, (tp, pp, cp)) as s: s.logprobs(seqs, TrainerRun())``.
    Each call builds the stage afresh under the run's policies, so runs never leak into each other.
    """

    ranks = MegatronRanks
