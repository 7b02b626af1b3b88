"""What every target provides for its role: the contract between the gate and a target folder.

The gate reaches a target only through its adapter module (``codegen.targets.Target.adapter``),
by the names ``codegen.targets.ROLE_API[role]`` lists; these Protocols say what those names are.
A new target is a folder that builds on this floor (``common/``), ``kernels/`` and ``families/``,
plus a registry entry; it needs no other target.

Optional names an adapter module may add: ``PRELOAD`` (modules the ranks' fork server imports
once, ``workers.preload``), ``LORA`` (it runs LoRA adapters), ``UNOBSERVABLE`` and
``TRAINING_DESCRIPTION`` (how it trains, where that differs from the role's description).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class TrainerSession(Protocol):
    """A trainer target's ranks for one layout, kept across calls (``common.workers.RankPool``
    behind it; the ranks join ``common.distributed.Rendezvous``)."""

    def start(self) -> None: ...

    def logprobs(self, sequences: Sequence[Sequence[int]], run: Any = None) -> Any:
        """One forward (``run.grads``: one backward) of ``sequences`` under ``run``
        (``common.run_types.TrainerRun``): a ``TrainerResult``."""

    def train(self, command: Any) -> Any:
        """``TrainInit`` (build the model and optimizer once) or ``TrainBatch`` (one step): a
        ``TrainStepResult``."""

    def close(self) -> None: ...


class TrainerTarget(Protocol):
    """A trainer target's adapter module (``ROLE_API["trainer"]``)."""

    MLP_BLOCKS: frozenset[str]  # the layer blocks its model implements (Family.layer_blocks)
    LAYOUT_AXES: frozenset[str]  # the Layout axes it runs (tp/pp/cp/dp/ep, or fsdp)
    TrainerSession: type  # TrainerSession(contract_id, weights_or_checkpoint, layout, ...)
    TrainerRun: type  # the common.run_types names, re-exported
    TrainerFault: type
    TrainBatch: type
    TrainInit: type
    OptimizerSettings: type


class RolloutTarget(Protocol):
    """A rollout target's adapter module (``ROLE_API["rollout"]``): its engine and reference
    model, with the floor's model description and checkpoint reading re-exported."""

    MLP_BLOCKS: frozenset[str]
    ModelArch: type  # common.model.ModelArch
    ReferenceModel: type
    RolloutEngine: type
    Request: type
    random_weights: Any  # common.model.random_weights
    load_checkpoint: Any  # common.checkpoint.load_checkpoint
    check_checkpoint: Any
    check_weight_files: Any
