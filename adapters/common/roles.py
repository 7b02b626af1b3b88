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

from typing import Any, Protocol


class TrainerRanks(Protocol):
    """What is a trainer target's own, handed to the floor's session (``common.trainer``: its
    ``TrainerSession`` is that class with ``ranks`` set). Static functions of a module-level
    class, which the ranks receive pickled by name; the parent calls only ``name``,
    ``world_size`` and ``model_profile``, so its module must import no heavy library at the top.
    """

    name: str  # names the session in errors, e.g. "fsdp trainer"

    @staticmethod
    def world_size(layout: Any) -> int:
        """The ranks ``layout`` (``common.layout.Layout``) runs; refuses a layout it cannot."""

    @staticmethod
    def model_profile(contract_id: str) -> Any:
        """The contract's ``ModelProfile`` (from the target's generated schema)."""

    @staticmethod
    def join(rank: int, job: Any) -> Any:
        """In a rank: join the session's process group and the target's own groups; returns
        the rank's place, handed back to every call below."""

    @staticmethod
    def order(place: Any) -> int | None:
        """Where the rank's layer dumps go in the merged ones (its pipeline stage), or None."""

    @staticmethod
    def logprobs(job: Any, run: Any, place: Any) -> tuple[Any, Any]:
        """One forward (``run.grads``: one backward) of ``job.sequences``: ``(TrainerResult or
        None where this rank has nothing to report, per-sequence layer dumps or None)``."""

    @staticmethod
    def train_init(job: Any, init: Any, place: Any) -> tuple[Any, Any]:
        """Build the model and optimizer once: ``(state kept for the steps, TrainStepResult)``."""

    @staticmethod
    def train_step(state: Any, job: Any, batch: Any, place: Any) -> Any:
        """One step of ``batch`` (``TrainBatch``): this rank's ``TrainStepResult``."""

    @staticmethod
    def shutdown() -> None: ...


class TrainerTarget(Protocol):
    """A trainer target's adapter module (``ROLE_API["trainer"]``)."""

    MLP_BLOCKS: frozenset[str]  # the layer blocks its model implements (Family.layer_blocks)
    LAYOUT_AXES: frozenset[str]  # the Layout axes it runs (tp/pp/cp/dp/ep, or fsdp)
    TrainerSession: type  # common.trainer.TrainerSession with the target's ranks
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
    RolloutSession: type  # the rank processes the gate drives
    arch_of: Any
    model_arch: Any
    policies: Any
