"""Parallel layouts of the parity gate: ``tp2``, ``pp2``, ``cp2``, ``tp2pp2`` … (``adapters.common.layout.Layout``,
checked by the launcher's layout rules)."""

from __future__ import annotations

from dataclasses import replace

from ..adapters.common.layout import Layout, LayoutError, parse_layout, parse_layouts
from ..codegen.targets import by_role
from ..codegen.vendored import load_target
from .targets import rollout_target

__all__ = [
    "Layout",
    "LayoutError",
    "allowed_rollout_tps",
    "default_layouts",
    "layout_problems",
    "parse_layout",
    "parse_layouts",
    "parse_rollout_tps",
    "rollout_tp_problems",
]


def layout_problems(contract_id: str, layout: Layout, model: str) -> list[str]:
    """Why the contract's model cannot run ``layout`` (the launcher's own layout rules: the
    gate runs the rollout at the layout's TP and the trainer at its TP, PP, CP, DP and EP, with
    the attention DP that EP needs: ``Layout.ep_dp``)."""
    validate_layout = by_role("launcher").runtime().validate_layout

    def check(lay: Layout) -> tuple:
        try:
            validate_layout(
                contract_id, replace(lay, rollout_tp=lay.tp, dp=lay.dp * lay.ep_dp), model
            )
        except LayoutError as exc:
            return exc.violations
        return ()

    found = check(layout)
    if any(v.flag == "--ep" for v in found):
        # The launcher's alternatives hold DP fixed; the gate picks the DP each EP size needs.
        sizes = (
            load_target(rollout_target()).schema.parallel_support_for(contract_id).train_ep_sizes
        )
        valid = tuple(
            e for e in sizes if not any(v.flag == "--ep" for v in check(replace(layout, ep=e)))
        )
        found = tuple(replace(v, valid=valid) if v.flag == "--ep" else v for v in found)
    return [f"{layout.name}: {v}" for v in found]


def default_layouts(
    contract_id: str, model: str, base: str, *, train_steps: bool, inject_faults: bool
) -> tuple[list[Layout], list[str]]:
    """The gate's layouts when none are given: ``base`` (``tp1,tp2,pp2,cp2``) and tp2pp2, plus
    ep2 and tp2ep2 (expert parallelism runs the forward only: not with ``train_steps``) and,
    with ``inject_faults``, tp4 (a sum of four partials has an order, so the reduction-order
    faults show there), each where the contract and the model allow it; tp1 always. Returns
    ``(layouts, why each base layout was left out)``: a contract may rule out CP (Qwen3-Next's
    linear attention) or a model TP 2; the extras are "where allowed" by definition."""
    extras = ["tp2pp2", *([] if train_steps else ["ep2", "tp2ep2"])]
    extras += ["tp4"] if inject_faults else []
    named = {lay.name for lay in parse_layouts(base)}
    chosen, left_out = [], []
    for lay in parse_layouts(",".join([base, *extras])):
        problems = [] if lay.name == "tp1" else layout_problems(contract_id, lay, model)
        if not problems:
            chosen.append(lay)
        elif lay.name in named:
            left_out.append(problems[0])
    return chosen, left_out


def rollout_tp_problems(contract_id: str, tp: int, model: str) -> list[str]:
    """Why the contract's model cannot run a rollout at TP ``tp`` (the launcher's rules)."""
    validate_layout = by_role("launcher").runtime().validate_layout

    try:
        validate_layout(contract_id, Layout(rollout_tp=tp), model)
    except LayoutError as exc:
        return [f"rollout tp{tp}: {v}" for v in exc.violations]
    return []


def allowed_rollout_tps(contract_id: str, model: str) -> list[int]:
    """Every rollout TP of the contract's ``parallel.rollout.tp`` that the model can run."""
    sizes = load_target(rollout_target()).schema.CONTRACT_DATA[contract_id]["parallel"]["rollout"][
        "tp"
    ]
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
