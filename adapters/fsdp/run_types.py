"""The run descriptions this target shares with the gate: the trainer role's data types
(``TrainerRun``, ``TrainerFault``, ``TrainBatch``, ``TrainInit``, ``OptimizerSettings``, results).

They are role-level, not Megatron's: the gate builds them the same way for every trainer target,
so this target takes the Megatron target's definitions (plain dataclasses, torch only) rather
than a second copy that could drift. ``OptimizerSettings`` means here: ``torch.optim.AdamW`` on
the FSDP-sharded (DTensor) parameters, no clipping."""

from __future__ import annotations

from ..megatron.run_types import (
    BACKENDS,
    OptimizerSettings,
    TrainBatch,
    TrainerFault,
    TrainerResult,
    TrainerRun,
    TrainInit,
    TrainStepResult,
    with_fault,
)

__all__ = [
    "BACKENDS",
    "OptimizerSettings",
    "TrainBatch",
    "TrainInit",
    "TrainStepResult",
    "TrainerFault",
    "TrainerResult",
    "TrainerRun",
    "with_fault",
]
