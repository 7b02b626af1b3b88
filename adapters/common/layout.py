"""The one parallel-layout type: what the launcher plans, the parity gate runs and the trainer
builds. Standard library only.

A ``Layout`` holds the training sizes (TP, PP, Ulysses CP, DP, expert-parallel EP) and the
rollout's (TP, DP). EP is folded over the other trainer ranks (megatron-core's expert groups,
expert TP 1): one trainer session runs ``tp * pp * cp * dp * ep_dp`` ranks, where ``ep_dp`` is
the attention data parallelism EP needs beyond TP x CP (``ep2`` alone: two DP ranks, each with
its own sequences, exchanging tokens with the other's experts). An explicit DP (``dp2``,
``tp2dp2``: data-parallel replicas, each with its share of the batch) is not combined with EP
(``parse_layout`` refuses it: EP picks its own attention DP). The
contract's rules for it live in one place, ``adapters/launcher/layout.py`` (``validate_layout``),
and every check (``contractgen plan``, ``handshake``, ``parity --layouts``) goes through them. A
layout the contract does not allow, or a layout string that does not parse, is a
``LayoutError``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_PART = re.compile(r"(fsdp|tp|pp|cp|dp|ep)([1-9][0-9]*)")


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
    ep: int = 1
    fsdp: int = 0
    """FSDP ranks of an FSDP trainer's layout (``fsdpN``: data parallel, parameters sharded
    by ``fully_shard``); 0: not an FSDP layout (a model-parallel trainer's)."""

    @property
    def ep_dp(self) -> int:
        """Attention data-parallel ranks a trainer session needs so that EP divides its
        TP x CP x DP ranks (1 when EP folds into TP x CP)."""
        return self.ep // math.gcd(self.ep, self.tp * self.cp)

    @property
    def world_size(self) -> int:
        """Ranks of one trainer session (TP x PP x CP x DP, times ``ep_dp``; ``fsdpN``: N)."""
        return self.tp * self.pp * self.cp * self.dp * self.ep_dp * max(self.fsdp, 1)

    @property
    def train_world(self) -> int:
        """Every trainer rank: TP x PP x CP x DP (EP is folded over them)."""
        return self.tp * self.pp * self.cp * self.dp

    @property
    def rollout_tp_size(self) -> int:
        return self.tp if self.rollout_tp is None else self.rollout_tp

    @property
    def rollout_gpus(self) -> int:
        return self.rollout_tp_size * self.rollout_dp

    @property
    def trainer_label(self) -> str:
        """``tp2pp1cp1`` (with ``dp2`` / ``ep2`` appended under data / expert parallelism; an
        FSDP layout: its name, ``fsdp2``): the pair names'."""
        if self.fsdp:
            return self.name
        extra = "".join(f"{k}{v}" for k, v in (("dp", self.dp), ("ep", self.ep)) if v > 1)
        return f"tp{self.tp}pp{self.pp}cp{self.cp}" + extra

    @property
    def sizes(self) -> dict[str, int]:
        """``{"tp", "pp", "cp", "dp", "ep"}`` (and ``"fsdp"`` for an FSDP layout): the trainer
        sizes a report lists."""
        sizes = {"tp": self.tp, "pp": self.pp, "cp": self.cp, "dp": self.dp, "ep": self.ep}
        return sizes | ({"fsdp": self.fsdp} if self.fsdp else {})

    @property
    def name(self) -> str:
        """The trainer sizes above 1 as ``tp2pp2`` (``tp1`` when all are 1), the form
        ``parse_layout`` reads."""
        sizes = (
            ("tp", self.tp), ("pp", self.pp), ("cp", self.cp), ("dp", self.dp), ("ep", self.ep)
        )  # fmt: skip
        rest = "".join(f"{k}{v}" for k, v in sizes if v > 1)
        if self.fsdp:
            return f"fsdp{self.fsdp}{rest}"
        return rest or "tp1"


def parse_layout(token: str) -> Layout:
    """``"tp2pp2"`` -> ``Layout(tp=2, pp=2)`` (the trainer sizes; any order, each axis once;
    ``dp2`` is data parallelism, ``ep2`` expert parallelism, the two not combined; ``fsdp2`` an
    FSDP trainer's two data-parallel ranks)."""
    token = token.strip()
    parts = _PART.findall(token)
    if not parts or "".join(a + b for a, b in parts) != token:
        raise LayoutError(
            f"layout {token!r}: expected tpN, ppN, cpN, dpN, epN or a combination such as tp2pp2 "
            "(or fsdpN for an FSDP trainer)"
        )
    sizes: dict[str, int] = {}
    for axis, n in parts:
        if axis in sizes:
            raise LayoutError(f"layout {token!r}: {axis} given twice")
        sizes[axis] = int(n)
    if sizes.get("dp", 1) > 1 and sizes.get("ep", 1) > 1:
        raise LayoutError(
            f"layout {token!r}: dp and ep together are not supported (EP brings the attention "
            "data parallelism it needs); give one of them"
        )
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


def padded_vocab(vocab_size: int, tp: int, unit: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``unit`` x ``tp``: every TP rank's vocab shard a
    whole number of ``unit`` columns. The one padding rule: the trainer's LM head pads to whole
    log-softmax vocab blocks (Megatron's ``make_vocab_size_divisible_by``), the rollout's to whole
    GEMM column tiles, the launch plan as the trainer does."""
    step = unit * tp
    return -(-vocab_size // step) * step
