"""One gate run: its ``GateConfig`` and the ``GateRun`` that holds the rollout and trainer
sessions open, caches their results per layout and releases them."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..adapters.common.rollout import RolloutJob, RolloutResult
from ..codegen.vendored import load_target
from .layouts import Layout
from .targets import adapter, rollout_adapter, rollout_target, runs_layout, trainer_targets
from .workload import DEFAULT_WORKLOAD, PromptSpec

# Which rollout logprobs the trainer must equal, by the contract's logprob contract.
ROLLOUT_LOGPROBS: dict[str, Callable[[RolloutResult], list[torch.Tensor]]] = {
    "sglang_prefill": lambda r: r.prefill_logprobs,
    "decode": lambda r: r.decode_logprobs,
}


def _say(message: str) -> None:
    print(f"parity: {message}", file=sys.stderr, flush=True)


@dataclass
class GateConfig:
    contract_id: str
    weights: Any  # HF state dict or checkpoint dir
    layouts: list[Layout]
    dtype_override: str | None = None
    device: str = "cpu"
    inject_faults: bool = False
    progress: bool = True
    rollout_tps: list[int] = field(default_factory=lambda: [1])
    """Rollout TP sizes; TP=1 (always run) is the reference every other run is compared with."""
    workload: tuple[PromptSpec, ...] = DEFAULT_WORKLOAD
    hf_reference: bool = True
    """Compare with transformers' float32 forward at every layout (when transformers imports)."""
    grads: bool = False
    planted_bugs: tuple[str, ...] = ()
    """Shared-kernel bugs switched on on BOTH sides for the whole run (the gate's self-test)."""
    training: Any = None
    """A ``training.TrainingConfig``: run the gate over RL steps instead (``--train-steps``)."""
    strict: bool = False
    """``--strict``: the scored runs also watch for stock ops the contract replaces
    (``kernel_audit``); any seen fails the gate."""
    trainers: tuple[str, ...] = ()
    """Trainer targets to run (``--trainers``), each paired with the rollout; empty: every
    trainer target whose generated policy has the contract (``targets.trainer_targets``)."""
    rollouts: tuple[str, ...] = ()
    """Rollout targets besides the reference engine (``--rollouts``; ``rollout_targets.py``)."""

    @property
    def trainer_targets(self) -> tuple[str, ...]:
        return self.trainers or tuple(trainer_targets(self.contract_id))


@dataclass
class GateRun:
    """Cached baseline runs and live process sessions, so each fault re-runs only its side."""

    config: GateConfig
    rollouts: dict[int, RolloutResult] = field(default_factory=dict)
    trainers: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    _rollout_sessions: dict[int, Any] = field(default_factory=dict)
    _trainer_sessions: dict[str, Any] = field(default_factory=dict)
    kernel_calls: dict[tuple[str, str], Any] = field(default_factory=dict)
    """(side, rollout ``tpN`` or layout name) -> the scored run's ``KernelCalls``."""
    trainer_target: str = ""
    """The trainer target the trainer calls run on (``use_trainer``); default the first."""

    def __post_init__(self) -> None:
        if not self.trainer_target:
            self.trainer_target = self.config.trainer_targets[0]

    @property
    def several_trainers(self) -> bool:
        return len(self.config.trainer_targets) > 1

    def use_trainer(self, name: str) -> None:
        """Run later trainer calls on target ``name`` (rollouts and their cache are shared)."""
        self.trainer_target = name

    @property
    def trainer_adapter(self):
        """The current trainer target's adapter module (``ROLE_API["trainer"]``)."""
        return adapter(self.trainer_target)

    @property
    def layouts(self) -> list[Layout]:
        """The configured layouts the current trainer target runs (``targets.runs_layout``)."""

        return [lay for lay in self.config.layouts if runs_layout(self.trainer_target, lay)]

    def layout_key(self, layout: Layout) -> str:
        """``layout``'s name for the current trainer: the bare name for the first trainer target
        (a one-trainer report keeps its shape), ``<target>/<name>`` for the others."""
        if self.trainer_target == self.config.trainer_targets[0]:
            return layout.name
        return f"{self.trainer_target}/{layout.name}"

    def trainer_label(self, layout: Layout) -> str:
        """``trainer tp2pp1cp1``, or ``<target> tp2pp1cp1`` when several trainers run."""
        who = self.trainer_target if self.several_trainers else "trainer"
        return f"{who} {layout.trainer_label}"

    @property
    def kernel_audit(self) -> str:
        """What the scored (baseline) runs record: ``kernels.audit`` mode."""
        return "strict" if self.config.strict else "count"

    def __enter__(self) -> GateRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def release(self, layout: Layout) -> None:
        """Stop a layout's trainer processes (memory: one layout's trainer ranks at a time)."""
        session = self._trainer_sessions.pop(self.layout_key(layout), None)
        if session is not None:
            session.close()

    def close(self) -> None:
        for session in [*self._rollout_sessions.values(), *self._trainer_sessions.values()]:
            session.close()
        self._rollout_sessions.clear()
        self._trainer_sessions.clear()

    @property
    def logprob_contract(self) -> str:
        schema = load_target(rollout_target()).schema
        return schema.get_contract_schema(self.config.contract_id).logprob_contract

    def release_rollout(self, tp: int) -> None:
        """Stop a rollout TP size's processes (its cached results stay)."""
        session = self._rollout_sessions.pop(tp, None)
        if session is not None:
            session.close()

    def rollout_session(self, tp: int) -> Any:
        """The live rollout processes at ``tp`` (started on first use): the rollout target's
        ``RolloutSession``."""
        if tp not in self._rollout_sessions:
            session = rollout_adapter().RolloutSession(tp, self.config.device)
            self._rollout_sessions[tp] = session
        return self._rollout_sessions[tp]

    def rollout(self, tp: int, **changes: Any) -> RolloutResult:
        """The rollout at ``tp`` (cached when unchanged); ``changes`` are ``RolloutJob`` fields."""
        baseline = not changes
        if baseline and tp in self.rollouts:
            return self.rollouts[tp]
        fields = {
            "dtype_override": self.config.dtype_override,
            "planted_bugs": self.config.planted_bugs,
            **changes,
            **({"kernel_audit": self.kernel_audit} if baseline else {}),
        }
        job = RolloutJob(
            self.config.contract_id,
            self.config.weights,
            tp,
            workload=self.config.workload,
            device=self.config.device,
            **fields,
        )
        result = self.rollout_session(tp).run(job)
        if baseline:
            self.rollouts[tp] = result
            self.kernel_calls["rollout", f"tp{tp}"] = result.extra.get("kernel_calls")
        return result

    def _trainer_session(self, layout: Layout):
        key = self.layout_key(layout)
        if key not in self._trainer_sessions:
            session = self.trainer_adapter.TrainerSession(
                self.config.contract_id,
                self.config.weights,
                layout,
                device=self.config.device,
            )
            session.start()
            self._trainer_sessions[key] = session
        return self._trainer_sessions[key]

    def trainer(
        self,
        layout: Layout,
        fault=None,
        dump_layers: bool = False,
        rollout: RolloutResult | None = None,
    ):
        """(scored logprobs per sequence, layer dumps or None) of the trainer at ``layout``, on
        the sequences of ``rollout`` (default: the unfaulted reference rollout, TP=1)."""
        TrainerRun = self.trainer_adapter.TrainerRun

        key = self.layout_key(layout)
        default = rollout is None
        if default and key in self.trainers and fault is None and not dump_layers:
            return self.trainers[key], None
        base = self.rollout(1) if default else rollout
        run = TrainerRun(
            dtype_override=self.config.dtype_override,
            fault=fault,
            dump_layers=dump_layers,
            planted_bugs=self.config.planted_bugs,
            sampling=tuple(base.sampling) or None,
        )
        if default and fault is None and not dump_layers:  # the scored run: audited
            run = dataclasses.replace(run, kernel_audit=self.kernel_audit)
        result = self._trainer_session(layout).logprobs(base.sequences, run)
        scored = [lp[p - 1 :] for lp, p in zip(result.logprobs, base.prompt_lens, strict=True)]
        if default and fault is None and not dump_layers:
            self.trainers[key] = scored
            self.kernel_calls["trainer", key] = result.kernel_calls
        return scored, result.layer_dumps

    def trainer_run(self, layout: Layout, sequences: list[list[int]], run):
        """One ``TrainerRun`` at ``layout`` on ``sequences`` (the gate's planted bugs added)."""

        run = dataclasses.replace(run, planted_bugs=self.config.planted_bugs + run.planted_bugs)
        return self._trainer_session(layout).logprobs(sequences, run)

    def scored_rollout(self, result: RolloutResult) -> list[torch.Tensor]:
        return ROLLOUT_LOGPROBS[self.logprob_contract](result)
