"""The contract's model profile as the rollout's ``ModelArch``, without importing megatron-core.

The gate's parent process starts trainer sessions with these (``trainer.py``) and never builds a
model: megatron-core is imported only where a model is built, in the ranks (its import took
about 3.6 s of CPU on a 2-core machine, 2026-12-07; ``tests/megatron/test_light_imports.py``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from contractgen.codegen.vendored import load_target

from ..common.checkpoint import check_checkpoint
from ..common.checkpoint import load_checkpoint as read_checkpoint
from ..common.model import ModelArch


@lru_cache(maxsize=1)
def generated() -> Any:
    """The generated megatron target (``.schema`` and ``.runtime_policy`` modules)."""
    return load_target("megatron")


def model_profile_for(contract_id: str) -> Any:
    """The contract's ``ModelProfile`` (dims of the model the contract was written for)."""
    return generated().schema.model_profile_for(contract_id)


def arch_for(contract_id: str, dims: Any = None) -> ModelArch:
    """The rollout's ``ModelArch`` for the contract's model profile (reference model by default),
    so both sides describe the model with one object."""
    return ModelArch.from_profile(model_profile_for(contract_id), dims)


def load_checkpoint(
    contract_id: str, path: str | Path
) -> tuple[ModelArch, dict[str, torch.Tensor]]:
    """``(arch, HF-named weights)`` of a checkpoint directory, read by the rollout's own reader
    (same config dialects, same coverage check against the contract's profile)."""
    return read_checkpoint(path, model_profile_for(contract_id))


def checkpoint_arch(contract_id: str, path: str | Path) -> ModelArch:
    """The ``ModelArch`` of a checkpoint directory from its ``config.json`` alone (the same
    coverage check as ``load_checkpoint``; no weights read)."""
    profile = model_profile_for(contract_id)
    return ModelArch.from_profile(profile, check_checkpoint(path, profile))
