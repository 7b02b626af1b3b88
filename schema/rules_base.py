"""What the cross-field rules share: the finding type and small helpers over a contract."""

from __future__ import annotations

from collections.abc import Iterator

from ..adapters.families import FAMILIES, Family
from .models import (
    Contract,
    ModelDims,
)

Finding = tuple[str, str]


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _nearest(allowed: list[int], n: int) -> str:
    good = sorted(allowed, key=lambda a: (abs(a - n), a))[:2]
    return ", ".join(str(g) for g in sorted(good)) if good else "none"


def _dims_entries(c: Contract) -> Iterator[tuple[str, ModelDims]]:
    for i, dims in enumerate(c.model_profile.checkpoints):
        yield f"model_profile.checkpoints.{i}", dims
    yield "model_profile.reference_model", c.model_profile.reference_model


def _family(c: Contract) -> Family | None:
    return FAMILIES.get(c.family)


def _tp_sizes_for(c: Contract, dims: ModelDims) -> list[int]:
    sizes = set(c.parallel.training.tp) | set(c.parallel.rollout.tp)
    if dims.tp_sizes is not None:
        sizes &= set(dims.tp_sizes)
    return sorted(sizes)
