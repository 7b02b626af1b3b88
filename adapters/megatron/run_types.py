"""What the trainer's parent process and its spawned ranks share: run descriptions, results, the
fault helper. A module of its own so that ``trainer`` (parent) and ``runtime`` (ranks) both import
it and not each other."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

# device -> torch.distributed backend of the spawned processes.
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


@dataclass(frozen=True)
class TrainerFault:
    """Fields to flip on the trainer side only (``dataclasses.replace`` on the policies)."""

    runtime_policy: Mapping[str, Any] = field(default_factory=dict)
    kernel_policy: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class TrainerResult:
    """Per-sequence logprobs: ``logprobs[i][j] = log p(seq_i[j + 1] | seq_i[: j + 1])``."""

    logprobs: list[torch.Tensor]
    layer_dumps: list[dict[str, torch.Tensor]] | None = None
    """Per sequence: ``{"layer.<i>": [len, hidden]}``, the residual stream after layer ``i``
    (output + residual), comparable with the rollout's ``layer_outputs``."""
    grads: dict[str, torch.Tensor] | None = None


@dataclass(frozen=True)
class TrainerRun:
    """One forward variant; several share one set of spawned processes (``trainer_logprobs_runs``)."""

    dtype_override: str | None = None
    fault: TrainerFault | None = None
    prefix_tree: bool = False
    prompt_lens: tuple[int, ...] | None = None
    dump_layers: bool = False
    grads: bool = False
    """Training step instead: loss = summed next-token cross-entropy (megatron-core's
    ``vocab_parallel_cross_entropy``) of each rank's tokens (with ``prompt_lens``: response
    tokens only), backward, ``grads.finalize_grads``;
    the result's ``grads`` holds global rank 0's parameter gradients (first stage, TP/CP rank 0)."""
    planted_bugs: tuple[str, ...] = ()
    """Shared-kernel bugs switched on for this run (``kernels.planted``: the parity gate's
    self-test; the rollout side gets the same ones)."""


def with_fault(policy: Any, changes: Mapping[str, Any]) -> Any:
    """``dataclasses.replace`` with a clear error for a misspelt field."""
    names = {f.name for f in dataclasses.fields(policy)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise ValueError(
            f"{type(policy).__name__} has no field(s) {unknown}; fields: {sorted(names)}"
        )
    return dataclasses.replace(policy, **changes)
