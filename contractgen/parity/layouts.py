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


def layout_problem(layout: ParityLayout, parallel, dims) -> str | None:
    """Why the contract's model cannot run ``layout`` (generated ParallelSupport + ModelDims)."""
    tp_sizes = set(parallel.train_tp_sizes) & set(parallel.rollout_tp_sizes)
    if dims.tp_sizes is not None:
        tp_sizes &= set(dims.tp_sizes)
    if layout.tp not in tp_sizes:
        return f"{layout.name}: TP={layout.tp} not allowed for {dims.name} (allowed: {sorted(tp_sizes)})"
    if layout.pp not in parallel.train_pp_sizes:
        return (
            f"{layout.name}: PP={layout.pp} not allowed (allowed: {list(parallel.train_pp_sizes)})"
        )
    if dims.num_layers % layout.pp:
        return (
            f"{layout.name}: PP={layout.pp} does not divide {dims.name}'s {dims.num_layers} layers"
        )
    if layout.cp not in parallel.train_cp_sizes:
        return (
            f"{layout.name}: CP={layout.cp} not allowed (allowed: {list(parallel.train_cp_sizes)})"
        )
    heads = dims.num_kv_heads // layout.tp if dims.num_kv_heads >= layout.tp else 1
    if layout.cp > 1 and (dims.num_attention_heads // layout.tp) % layout.cp:
        return (
            f"{layout.name}: Ulysses CP={layout.cp} must divide the {dims.num_attention_heads // layout.tp} "
            "attention heads per TP rank"
        )
    if layout.cp > 1 and heads % layout.cp and layout.cp % heads:
        return (
            f"{layout.name}: Ulysses CP={layout.cp} and {heads} KV heads per TP rank do not divide"
        )
    return None
