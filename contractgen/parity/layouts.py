"""Parallel layouts of the parity gate: ``tp2``, ``pp2``, ``cp2``, ``tp2pp2`` …"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PART = re.compile(r"(tp|pp|cp)([1-9][0-9]*)")


class LayoutError(ValueError):
    """A layout string or size the contract's model cannot run."""


@dataclass(frozen=True)
class ParityLayout:
    name: str
    tp: int = 1
    pp: int = 1
    cp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp


def parse_layout(token: str) -> ParityLayout:
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
    return ParityLayout(token, **sizes)


def parse_layouts(spec: str) -> list[ParityLayout]:
    layouts = [parse_layout(t) for t in spec.split(",") if t.strip()]
    if not layouts:
        raise LayoutError("--layouts: give at least one layout, e.g. tp1,tp2,pp2,cp2")
    names = [lay.name for lay in layouts]
    if len(set(names)) != len(names):
        raise LayoutError(f"--layouts: repeated layout in {spec!r}")
    return layouts


def layout_problems(contract_id: str, layout: ParityLayout, model: str) -> list[str]:
    """Why the contract's model cannot run ``layout`` (the launcher's own layout rules: the
    gate runs the rollout at the layout's TP and the trainer at its TP, PP and CP)."""
    from ..adapters.launcher.layout import Layout, validate_layout
    from ..adapters.launcher.layout import LayoutError as LaunchLayoutError

    try:
        launch = Layout(tp=layout.tp, pp=layout.pp, cp=layout.cp, rollout_tp=layout.tp)
        validate_layout(contract_id, launch, model)
    except LaunchLayoutError as exc:
        return [f"{layout.name}: {v}" for v in exc.violations]
    return []


def rollout_tp_problems(contract_id: str, tp: int, model: str) -> list[str]:
    """Why the contract's model cannot run a rollout at TP ``tp`` (the launcher's rules)."""
    from ..adapters.launcher.layout import Layout, validate_layout
    from ..adapters.launcher.layout import LayoutError as LaunchLayoutError

    try:
        validate_layout(contract_id, Layout(rollout_tp=tp), model)
    except LaunchLayoutError as exc:
        return [f"rollout tp{tp}: {v}" for v in exc.violations]
    return []


def allowed_rollout_tps(contract_id: str, model: str) -> list[int]:
    """Every rollout TP of the contract's ``parallel.rollout.tp`` that the model can run."""
    from ..vendored import load_target
    from . import ROLLOUT

    sizes = load_target(ROLLOUT).schema.CONTRACT_DATA[contract_id]["parallel"]["rollout"]["tp"]
    return [tp for tp in sorted(sizes) if not rollout_tp_problems(contract_id, tp, model)]


def parse_rollout_tps(spec: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; TP=1 (the reference) is always included."""
    try:
        sizes = sorted({int(t) for t in spec.split(",") if t.strip()} | {1})
    except ValueError:
        raise LayoutError(f"--rollout-tps {spec!r}: expected sizes such as 1,2,4") from None
    if sizes[0] < 1:
        raise LayoutError(f"--rollout-tps {spec!r}: sizes must be >= 1")
    return sizes
