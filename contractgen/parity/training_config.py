"""What a ``--train-steps`` run is: its config, faults, the step's workload, the toy task's reward
and GRPO advantages, and the step-0 gradient check."""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..adapters.common.lora import CHECKPOINT_ADAPTER_FILE, split_adapter
from ..adapters.families import LAYER_PREFIX
from . import correctness  # as a module: tests replace its grad_reference_of
from .fault_runs import fault_change
from .faults import catalogue
from .gate_run import GateRun
from .layouts import Layout
from .pairs import _policies_at
from .reference import transformers_reason
from .workload import PromptSpec, sample_seed

STALE_SHARD = "sync.stale_shard"
DP_DESYNC = "dp.desync_rank"
"""The last data-parallel rank of every DP group skips the gradient reduction (it still joins
the collective) and steps on its own gradient: its replica drifts from step 0's update on."""
STALE_ADAPTER = "sync.stale_adapter"
"""The rollout ignores every LoRA adapter push after step 0: it serves step 0's adapter."""
NO_ADAPTER = "sync.no_adapter"
"""The rollout ignores every LoRA adapter push: it serves the base weights alone."""
ADAPTER_FAULTS = (STALE_ADAPTER, NO_ADAPTER)
SYNC_FAULTS = (STALE_SHARD, DP_DESYNC, *ADAPTER_FAULTS)

TASK = (
    "reward = share of response tokens whose id is below vocab_size / 8 (a verifiable toy task: "
    "no data set); GRPO advantages = (reward - group mean) / (group std + 1e-6)"
)


@dataclass(frozen=True)
class TrainingConfig:
    """What ``--train-steps`` runs (see the module docstring)."""

    steps: int
    prompts: int = 2
    group_size: int = 4
    prompt_tokens: int = 70
    new_tokens: int = 10
    lr: float = 1e-2
    clip_eps: float = 0.2
    fault: str | None = None
    temperature: float = 1.0
    """The rollout's sampling temperature; the trainer scores the same processed distribution."""
    grad_check: bool = True
    """Check each layout's step-0 gradient against float64 autograd (``_GradCheck``)."""
    microbatches: int = 1
    """Microbatches per step on each data-parallel rank (gradient accumulation)."""
    distributed_optimizer: bool = False
    """Shard the optimizer state over the DP ranks (the trainer's ``ShardedAdamW``)."""


GRAD_CHECK_LOSS = "minus the sum of the step's response-token logprobs (the --grads loss)"


@dataclass
class _GradCheck:
    """Step 0's gradient check, ``--grads``'s on the step's samples: each layout's trainer, in
    the processes it trains in, takes a float32 backward of ``GRAD_CHECK_LOSS`` at the step-0
    weights (a stage built for it; the training stage is untouched), compared parameter by
    parameter with float64 autograd through transformers (under LoRA the adapter's A and B,
    against peft's float64 autograd with the base frozen). The reference is computed once per set
    of samples (every layout samples the same at step 0 unless a fault moves them)."""

    run: GateRun
    note: str | None
    """Why no layout is checked (transformers unavailable), else None."""
    refs: dict = field(default_factory=dict)

    @property
    def lora(self) -> bool:
        """The gate serves an adapter: the check compares A's and B's gradients only."""
        weights = getattr(self.run.config, "weights", None)
        if isinstance(weights, (str, Path)):
            return (Path(weights) / CHECKPOINT_ADAPTER_FILE).is_file()
        return isinstance(weights, dict) and bool(split_adapter(weights)[1])

    def layout(self, trainer: Any, layout: Layout, base: Any, fault: Any) -> dict | None:
        if self.note is not None:
            return None
        if not getattr(self.run.trainer_adapter, "GRADIENT_RUN", True):
            return {
                "name": layout.name,
                **layout.sizes,
                "supported": False,
                "note": f"not supported: the {self.run.trainer_target} trainer has no "
                "gradient run (TrainerRun.grads) yet",
            }
        key = tuple(tuple(s) for s in base.sequences)
        if key not in self.refs:
            seqs = [list(s) for s in base.sequences]
            self.refs[key] = correctness.grad_reference_of(
                self.run.config, seqs, list(base.prompt_lens)
            )
        ref = self.refs[key]
        run = correctness.grads_run(ref, fault=fault, planted_bugs=self.run.config.planted_bugs)
        return correctness.compare_grads(ref, layout, trainer.logprobs(ref.sequences, run).hf_grads)

    def report(self, entries: list[dict]) -> dict:
        """A step's ``grads``: the settings and each layout's comparison."""
        return {
            "dtype": "float32 trainer vs float64 transformers autograd"
            + (" (peft: the adapter's A and B; the base is frozen)" if self.lora else ""),
            "loss": GRAD_CHECK_LOSS,
            "tolerance": correctness.GRAD_TOLERANCE,
            "tolerance_meaning": "max |grad - float64 grad| / max |float64 grad|, per parameter",
            "note": self.note,
            "per_layout": [e["grads"] for e in entries if e.get("grads") is not None],
        }


def _grad_check(run: GateRun, cfg: TrainingConfig) -> _GradCheck | None:
    if not cfg.grad_check:
        return None
    return _GradCheck(run, transformers_reason())


def _say(message: str) -> None:
    print(f"parity: {message}", file=sys.stderr, flush=True)


def step_workload(step: int, cfg: TrainingConfig, vocab_size: int) -> tuple[PromptSpec, ...]:
    """The step's requests: ``cfg.prompts`` fresh prompts (the longest ``prompt_tokens`` long,
    the others spread below), each sampled ``group_size`` times at ``cfg.temperature`` with a
    seed of its own (``sample_seed``), joining the batch at staggered decode steps."""
    g = torch.Generator().manual_seed(10_000 + step)
    specs = []
    for i in range(cfg.prompts):
        n = max(1, cfg.prompt_tokens * (cfg.prompts - i) // cfg.prompts)
        prompt = tuple(torch.randint(0, vocab_size, (n,), generator=g).tolist())
        for j in range(cfg.group_size):
            k = i * cfg.group_size + j
            specs.append(
                PromptSpec(
                    rid=f"s{step}p{i}g{j}",
                    prompt_len=n,
                    max_new_tokens=cfg.new_tokens,
                    temperature=cfg.temperature,
                    seed=sample_seed(0, step, i, j),
                    arrival_step=k % 3,
                    prompt_ids=prompt,
                )
            )
    return tuple(specs)


def reward(response: list[int], vocab_size: int) -> float:
    """The toy task's reward of one response (see ``TASK``)."""
    return sum(t < vocab_size // 8 for t in response) / max(1, len(response))


def grpo_advantages(rewards: list[float], group_size: int) -> list[float]:
    """Each reward minus its group's mean, over the group's (population) std + 1e-6."""
    out = []
    for lo in range(0, len(rewards), group_size):
        group = rewards[lo : lo + group_size]
        mean, std = statistics.fmean(group), statistics.pstdev(group)
        out += [(r - mean) / (std + 1e-6) for r in group]
    return out


def stale_tensor(arch: Any) -> str:
    """The tensor ``sync.stale_shard`` leaves stale: layer 0's last row-parallel weight (TP shards
    it by K, so at TP > 1 one rank's slice is stale)."""
    spec = arch.spec
    rows = [w.hf_name for w in spec.layer_weights.values() if w.shard == "row"]
    return LAYER_PREFIX.format(i=0) + rows[-1]


def training_faults(run: GateRun) -> list[str]:
    """Every name ``--train-fault`` accepts."""

    first = run.layouts[0]
    return [*SYNC_FAULTS, *(f.name for f in catalogue(*_policies_at(run, first)))]


def _one_side_fault(run: GateRun, name: str | None, layout: Layout):
    """(rollout ``RolloutJob`` changes, trainer ``TrainerFault`` or None) for a policy fault."""
    TrainerFault = run.trainer_adapter.TrainerFault

    if name is None or name in SYNC_FAULTS:
        return {}, None
    fault = next(f for f in catalogue(*_policies_at(run, layout)) if f.name == name)
    change = fault_change(run, fault, layout)
    if fault.side == "rollout":
        return {f"{fault.kind}_changes": change}, None
    return {}, TrainerFault(**{f"{fault.kind}_policy": change})
