"""The one parallel-layout type: what the launcher plans, the parity gate runs and the trainer
builds. Standard library only.

A ``Layout`` holds the training sizes (TP, PP, Ulysses CP, DP) and the rollout's (TP, DP). The
contract's rules for it live in one place, ``adapters/launcher/layout.py`` (``validate_layout``),
and every check (``contractgen plan``, ``handshake``, ``parity --layouts``) goes through them. A
layout the contract does not allow, or a layout string that does not parse, is a
``LayoutError``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PART = re.compile(r"(tp|pp|cp)([1-9][0-9]*)")


class LayoutError(ValueError):
    """A layout the contract does not allow (``violations``: every broken rule, when the
    contract's rules were checked) or a layout string that does not parse."""

    def __init__(self, message: str, violations: tuple = ()) -> None:
        super().__init__(message)
        self.violations = tuple(violations)


@dataclass(frozen=True)
class Layout:
    """Parallel sizes of one run. ``rollout_tp`` defaults to the training TP."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp: int = 1
    rollout_tp: int | None = None
    rollout_dp: int = 1
    world: int | None = None  # when given, must equal tp * pp * cp * dp

    @property
    def world_size(self) -> int:
        """Ranks of one trainer replica (TP x PP x CP): what a trainer session starts."""
        return self.tp * self.pp * self.cp

    @property
    def train_world(self) -> int:
        return self.world_size * self.dp

    @property
    def rollout_tp_size(self) -> int:
        return self.tp if self.rollout_tp is None else self.rollout_tp

    @property
    def rollout_gpus(self) -> int:
        return self.rollout_tp_size * self.rollout_dp

    @property
    def name(self) -> str:
        """The trainer sizes above 1 as ``tp2pp2`` (``tp1`` when all are 1), the form
        ``parse_layout`` reads."""
        sizes = (("tp", self.tp), ("pp", self.pp), ("cp", self.cp))
        return "".join(f"{k}{v}" for k, v in sizes if v > 1) or "tp1"


def parse_layout(token: str) -> Layout:
    """``"tp2pp2"`` -> ``Layout(tp=2, pp=2)`` (the trainer sizes; any order, each axis once)."""
    token = token.strip()
    parts = _PART.findall(token)
    if not parts or "".join(a + b for a, b in parts) != token:
        raise LayoutError(
            f"layout {token!r}: expected tpN, ppN, cpN or a combination such as tp2pp2"
        )
    sizes: dict[str, int] = {}
    for axis, n in parts:
        if axis in sizes:
            raise LayoutError(f"layout {token!r}: {axis} given twice")
        sizes[axis] = int(n)
    return Layout(**sizes)


def parse_layouts(spec: str) -> list[Layout]:
    """``"tp1,tp2,pp2"`` -> layouts in the order given; a layout named twice is refused."""
    layouts = [parse_layout(t) for t in spec.split(",") if t.strip()]
    if not layouts:
        raise LayoutError("--layouts: give at least one layout, e.g. tp1,tp2,pp2,cp2")
    names = [lay.name for lay in layouts]
    if len(set(names)) != len(names):
        raise LayoutError(f"--layouts: repeated layout in {spec!r}")
    return layouts
