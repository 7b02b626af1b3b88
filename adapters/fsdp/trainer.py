"""The FSDP trainer the parity gate calls: ``TrainerSession`` (``ROLE_API["trainer"]``), the
floor's session (``adapters.common.trainer``) running this target's ranks (``FsdpRanks``).

A session spawns ``layout.fsdp`` ranks that keep running across calls; each call builds the
sharded model afresh under the run's policies (milliseconds for the tiny models), so faults never
leak between runs. Weights come as one shared-memory buffer (``SharedTensors``).
"""

from __future__ import annotations

from typing import Any

from ..common import trainer
from ..common.layout import Layout, LayoutError
from ..common.run_types import TrainBatch, TrainerRun, TrainInit, TrainStepResult
from ..common.workers import TrainerJob
from .policy import generated


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


class FsdpRanks:
    """What the floor's session (``common.trainer``) runs of this target: ``layout.fsdp`` ranks
    (gloo on CPU, NCCL on CUDA, one GPU per rank), each a sharded transformers model
    (``runtime``, ``training``); rank code imported in the ranks only."""

    name = "fsdp trainer"
    world_size = staticmethod(fsdp_ranks)

    @staticmethod
    def model_profile(contract_id: str) -> Any:
        return generated().schema.model_profile_for(contract_id)

    @staticmethod
    def join(rank: int, job: TrainerJob) -> Any:
        from . import runtime  # heavy: transformers, in ranks only

        return runtime.init_distributed(rank, job.layout.fsdp, job.port, job.device)

    @staticmethod
    def order(place: Any) -> None:
        return None

    @staticmethod
    def logprobs(job: TrainerJob, run: TrainerRun, me: Any) -> tuple[Any, Any]:
        """A forward: each rank scores its share (merged by the session); ``run.grads``: one
        backward, rank 0 answering with every full gradient (``runtime.backward_grads``)."""
        from . import runtime  # heavy

        if run.grads:
            return runtime.backward_grads(job, run, me), None
        return runtime.forward_logprobs(job, run, me)

    @staticmethod
    def train_init(job: TrainerJob, init: TrainInit, me: Any) -> tuple[Any, TrainStepResult]:
        """The sharded model and AdamW; rank 0's result carries the full state dict."""
        from . import training  # heavy

        state = training.init_state(job, init, me)
        return state, TrainStepResult(weights=training.full_weights(state, job, me))

    @staticmethod
    def train_step(state: Any, job: TrainerJob, batch: TrainBatch, me: Any) -> TrainStepResult:
        """One step (``training.py``); rank 0's result carries the statistics and weights."""
        from . import training  # heavy

        return training.train_step(state, job, batch, me)

    @staticmethod
    def shutdown() -> None:
        from . import runtime  # heavy

        runtime.shutdown()


class TrainerSession(trainer.TrainerSession):
    """Spawned FSDP ranks kept alive across calls (``common.trainer.TrainerSession``).

    ``with TrainerSession(contract, weights, parse_layout("fsdp2")) as s: s.logprobs(seqs)``.
    """

    ranks = FsdpRanks
