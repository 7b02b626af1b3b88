"""The options of ``contractgen parity``, grouped as the help text groups them, and the checks of
their combinations (one line, exit 2, before any worker starts).

``ParityOptions.from_params`` takes click's keyword arguments as they come; the command reads the
groups, never the 29 flat values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..parity.workload import WORKLOADS
from ._common import fail

DEFAULT_CONTRACT = "qwen3_dense_true_on_policy_v1"
DEFAULT_LAYOUTS = "tp1,tp2,pp2,cp2"


@dataclass(frozen=True)
class ModelOptions:
    """What is gated: the contract, the weights (``--checkpoint`` / ``--model``), dtype, device."""

    contract_id: str
    checkpoint: Path | None
    model_name: str | None
    dtype: str
    device: str


@dataclass(frozen=True)
class LayoutOptions:
    """Where it runs: trainer layouts, rollout TPs, trainer and rollout targets (None: the
    defaults)."""

    layouts: str | None
    rollout_tps: str | None
    trainers: str | None
    rollouts: str | None


@dataclass(frozen=True)
class WorkloadOptions:
    """The requests scored: a preset and its overrides."""

    workload: str
    requests: int | None
    prompt_tokens: int | None
    new_tokens: int | None

    def sizes(self) -> tuple[int, int, int]:
        """``(requests, prompt tokens, new tokens)``: the preset with the flags given over it."""
        preset = WORKLOADS[self.workload]
        return (
            self.requests or preset[0],
            self.prompt_tokens or preset[1],
            self.new_tokens or preset[2],
        )


@dataclass(frozen=True)
class CheckOptions:
    """What the one-shot gate checks besides the bitwise pairs."""

    inject_faults: bool
    grads: bool
    no_reference: bool
    plant_bugs: tuple[str, ...]
    strict: bool


@dataclass(frozen=True)
class TrainingOptions:
    """``--train-steps`` and the flags that only mean something with it."""

    train_steps: int
    train_fault: str | None
    train_lr: float | None
    train_temperature: float | None
    train_microbatches: int | None
    train_distributed_optimizer: bool
    no_grad_check: bool


@dataclass(frozen=True)
class LoraOptions:
    """The adapter served on both sides: a seeded random one (``--lora``) or a folder."""

    lora: str | None
    lora_adapter: Path | None


@dataclass(frozen=True)
class OutputOptions:
    """Where the report goes."""

    json_path: Path | None
    quiet: bool


@dataclass(frozen=True)
class ParityOptions:
    """Every option of ``contractgen parity``, one group per concern."""

    model: ModelOptions
    layouts: LayoutOptions
    workload: WorkloadOptions
    checks: CheckOptions
    training: TrainingOptions
    lora: LoraOptions
    output: OutputOptions

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ParityOptions:
        """The groups from click's keyword arguments (each group takes its fields by name)."""

        def group(kind: type) -> Any:
            return kind(**{f.name: params[f.name] for f in dataclasses.fields(kind)})

        return cls(
            model=group(ModelOptions),
            layouts=group(LayoutOptions),
            workload=group(WorkloadOptions),
            checks=group(CheckOptions),
            training=group(TrainingOptions),
            lora=group(LoraOptions),
            output=group(OutputOptions),
        )


def check_planted_bugs(opts: ParityOptions) -> None:
    """Every ``--plant-bug`` is known, and a gradient-only one has a gradient check to catch it."""
    from ..adapters.kernels.planted import BACKWARD_BUGS, BUGS  # torch: heavy

    plant_bugs, training = opts.checks.plant_bugs, opts.training
    if unknown := sorted(set(plant_bugs) - set(BUGS) - set(BACKWARD_BUGS)):
        known = ", ".join(sorted({*BUGS, *BACKWARD_BUGS}))
        fail(f"error: --plant-bug {unknown[0]!r}: unknown; known: {known}")
    grad_checked = (not training.no_grad_check) if training.train_steps else opts.checks.grads
    if not grad_checked and (backward := sorted(set(plant_bugs) & set(BACKWARD_BUGS))):
        fail(
            f"error: --plant-bug {backward[0]}: a gradient-only bug, which only a gradient "
            "check can catch; add --grads, or with --train-steps drop --no-grad-check"
        )


def check_training_flags(opts: ParityOptions) -> None:
    """With --train-steps, no one-shot check; without it, no training flag."""
    t, checks = opts.training, opts.checks
    if t.train_steps:
        given = [
            flag
            for flag, on in (
                ("--inject-faults", checks.inject_faults),
                ("--grads", checks.grads),
                ("--strict", checks.strict),
            )
            if on
        ]
        if given:
            fail(f"error: {given[0]} cannot be combined with --train-steps (use --train-fault)")
    elif (
        t.train_fault is not None
        or t.train_lr is not None
        or t.no_grad_check
        or t.train_temperature
        or t.train_microbatches is not None
        or t.train_distributed_optimizer
    ):
        fail(
            "error: --train-fault, --train-lr, --train-temperature, --train-microbatches, "
            "--train-distributed-optimizer and --no-grad-check need --train-steps N (N >= 1)"
        )


def with_training(config, opts: ParityOptions, serves_adapter: bool):
    """``config`` running the RL loop of ``--train-steps`` with its flags applied; exit 2 for a
    ``--train-fault`` the run cannot have or microbatches a DP share cannot fill."""
    from ..parity.training import ADAPTER_FAULTS, DP_DESYNC  # torch: heavy

    t, w = opts.training, opts.workload
    own = w.prompt_tokens is None and w.workload == "default"  # the RL loop's own prompt length
    config = _training_config(
        config, t.train_steps, t.train_fault, t.train_lr, w.requests, w.sizes(), own
    )
    training = dataclasses.replace(config.training, grad_check=not t.no_grad_check)
    if t.train_temperature is not None:
        training = dataclasses.replace(training, temperature=t.train_temperature)
    if t.train_microbatches is not None:
        training = dataclasses.replace(training, microbatches=t.train_microbatches)
    if t.train_distributed_optimizer:
        training = dataclasses.replace(training, distributed_optimizer=True)
    if t.train_fault == DP_DESYNC and all(lay.dp == 1 for lay in config.layouts):
        fail(f"error: --train-fault {DP_DESYNC} needs a data-parallel layout (dp2, tp2dp2)")
    if t.train_fault in ADAPTER_FAULTS and not serves_adapter:
        fail(f"error: --train-fault {t.train_fault} needs a LoRA adapter to push: add --lora RANK")
    per_step = training.prompts * training.group_size
    for lay in config.layouts:  # the smallest DP share must fill every microbatch
        if per_step // lay.dp < training.microbatches:
            fail(
                f"error: --train-microbatches {training.microbatches}: layout {lay.name} "
                f"gives each of its {lay.dp} data-parallel ranks {per_step // lay.dp} of the "
                f"step's {per_step} sequences; give at most that many microbatches or more "
                "--requests"
            )
    return dataclasses.replace(config, training=training)


def _training_config(
    config,
    steps: int,
    fault: str | None,
    lr: float | None,
    requests: int | None,
    sizes: tuple[int, int, int],
    own_prompt: bool = False,
):
    """``config`` running ``steps`` RL steps (``own_prompt``: at ``TrainingConfig``'s prompt
    length, not the one-shot workload's); exit 2 for an unknown ``--train-fault``."""
    from ..parity.harness import GateRun  # torch: heavy
    from ..parity.training import TrainingConfig, training_faults

    if fault is not None and fault not in (known := training_faults(GateRun(config))):
        fail(f"error: --train-fault {fault!r}: unknown; known: {', '.join(known)}")
    training = TrainingConfig(
        steps,
        prompts=requests or TrainingConfig.prompts,
        prompt_tokens=TrainingConfig.prompt_tokens if own_prompt else sizes[1],
        new_tokens=sizes[2],
        lr=lr or TrainingConfig.lr,
        fault=fault,
    )
    return dataclasses.replace(config, training=training)
