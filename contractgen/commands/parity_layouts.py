"""Which trainer targets ``contractgen parity`` pairs with the rollout, and which layouts each
runs: every refusal is one line, exit 2, before any worker starts.

Imports of the adapters, the registry and torch stay inside the functions: they are heavy, and
``contractgen --help`` must not pay for them.
"""

from __future__ import annotations

import click

from ._common import fail
from .parity_options import DEFAULT_LAYOUTS, ParityOptions


def _check_blocks(contract_id: str, profile, trainers: list[str]) -> None:
    """Both sides (the rollout and every trainer target in ``trainers``) implement every MLP
    block the contract's models have, else one line, exit 2 (before any worker starts)."""
    from ..adapters.families import family_for
    from ..parity.targets import adapter, rollout_target

    family = family_for(profile.family)
    models = (*profile.checkpoints, profile.reference_model)
    needed = frozenset().union(*(family.mlp_blocks(d) for d in models))
    sides = [("rollout", rollout_target()), *(("trainer", t) for t in trainers)]
    for role, target in sides:
        have = adapter(target).MLP_BLOCKS
        if missing := sorted(needed - have):
            fail(
                f"error: {contract_id}: the {role} side ({target}) is not implemented yet for "
                f"the {', '.join(missing)} block of {family.name} models (it implements: "
                f"{', '.join(sorted(have))}); parity needs both sides"
            )


def _check_lora_trainers(trainers: list[str]) -> None:
    """Every trainer target in ``trainers`` runs LoRA adapters (its adapter's ``LORA``), else
    one line, exit 2 (before any worker starts)."""
    from ..codegen.targets import targets_for_role
    from ..parity.targets import adapter

    able = [t.name for t in targets_for_role("trainer") if getattr(t.runtime(), "LORA", False)]
    for name in trainers:
        if not getattr(adapter(name), "LORA", False):
            fail(
                f"error: --lora: the {name} trainer does not run LoRA adapters yet (trainers "
                f"that do: {', '.join(able) or 'none'}); give --trainers {','.join(able[:1])}"
            )


def _default_trainers(contract_id: str, layouts: str | None) -> list[str]:
    """Without ``--trainers``: every trainer target with the contract that runs one of the
    layouts (``--layouts``, else the defaults): the model-parallel trainer for ``tp1,…``, the
    FSDP trainer for ``fsdpN``."""
    from ..parity.layouts import LayoutError, parse_layouts
    from ..parity.targets import runs_layout, trainer_targets

    try:
        wanted = parse_layouts(layouts or DEFAULT_LAYOUTS)
    except LayoutError:
        wanted = []  # reported where the layouts are checked
    found = trainer_targets(contract_id)
    return [t for t in found if any(runs_layout(t, lay) for lay in wanted)] or found[:1]


def _layouts_per_trainer(
    chosen: list, trainers: list[str], defaults: bool, explicit: bool
) -> tuple[list, list[str]]:
    """Each trainer target runs the layouts of its axes (``targets.runs_layout``): with no
    ``--layouts``, a target's own ``DEFAULT_LAYOUTS`` (where its adapter has them) join the
    defaults; a default trainer that runs none of the layouts is left out, one named in
    ``--trainers`` that runs none is refused."""
    from ..parity.layouts import LayoutError, parse_layouts
    from ..parity.targets import adapter, runs_layout

    if defaults and explicit:
        for name in trainers:
            extra = getattr(adapter(name), "DEFAULT_LAYOUTS", None)
            if extra:
                chosen = chosen + [
                    lay for lay in parse_layouts(extra) if lay.name not in {c.name for c in chosen}
                ]
        chosen = [lay for lay in chosen if any(runs_layout(t, lay) for t in trainers)]
    idle = [t for t in trainers if not any(runs_layout(t, lay) for lay in chosen)]
    if idle and explicit:
        axes = ", ".join(sorted(adapter(idle[0]).LAYOUT_AXES))
        raise LayoutError(
            f"--trainers {idle[0]}: none of the layouts {[lay.name for lay in chosen]} is one it "
            f"runs (its axes: {axes}); add such layouts to --layouts"
        )
    return chosen, [t for t in trainers if t not in idle]


def _fit_gpus(layouts: list, gpus: int, given: bool) -> list:
    """One GPU per trainer rank: the default layouts stop at the GPUs there are; a layout asked
    for (``given``) that needs more is refused with one line, exit 2, before anything starts."""
    if not given:
        return [lay for lay in layouts if lay.world_size <= gpus]
    if too_big := [lay for lay in layouts if lay.world_size > gpus]:
        lay = too_big[0]
        also = f" (also {', '.join(x.name for x in too_big[1:])})" if too_big[1:] else ""
        fail(
            f"error: layout {lay.name} needs {lay.world_size} CUDA devices, {gpus} visible{also}; "
            f"give --layouts of at most {gpus} trainer rank{'s' if gpus != 1 else ''} each "
            f"(e.g. tp1) or run where {lay.world_size} CUDA devices are visible"
        )
    return layouts


def choose_layouts(opts: ParityOptions, arch, trainers: list[str], gpus: int | None):
    """``(layouts, trainers)``: ``--layouts`` or the defaults the contract and model allow (on
    CUDA, those that fit the ``gpus`` visible), each trainer target kept where it runs one of
    them; ``LayoutError``."""
    from ..parity.layouts import LayoutError, default_layouts, parse_layouts

    layouts, train_steps = opts.layouts.layouts, opts.training.train_steps
    if layouts is None:
        chosen, left_out = default_layouts(
            opts.model.contract_id,
            arch.name,
            DEFAULT_LAYOUTS,
            train_steps=bool(train_steps),
            inject_faults=opts.checks.inject_faults,
        )
        for why in [] if opts.output.quiet else left_out:
            click.echo(f"parity: default layout left out: {why}", err=True)
    else:
        chosen = parse_layouts(layouts)
        if train_steps and (ep := [lay.name for lay in chosen if lay.ep > 1]):
            raise LayoutError(
                f"--layouts {', '.join(ep)}: expert parallelism runs the forward only (the "
                "token exchange has no backward yet); --train-steps needs EP 1 layouts"
            )
    chosen, trainers = _layouts_per_trainer(
        chosen, trainers, layouts is None, explicit=opts.layouts.trainers is not None
    )
    if gpus is not None:
        chosen = _fit_gpus(chosen, gpus, given=layouts is not None)
    return chosen, trainers


def rollout_tps_of(opts: ParityOptions, arch, gpus: int | None) -> list[int]:
    """``--rollout-tps`` checked against the contract, model and GPUs, else every rollout TP of
    the contract the model can run (on CUDA, at most the GPUs there are); ``LayoutError``."""
    from ..parity.layouts import (
        LayoutError,
        allowed_rollout_tps,
        parse_rollout_tps,
        rollout_tp_problems,
    )

    contract_id, rollout_tps = opts.model.contract_id, opts.layouts.rollout_tps
    if rollout_tps is None:
        tps = allowed_rollout_tps(contract_id, arch.name)
        if gpus is not None:  # one GPU per rank: the default stops at the GPUs there are
            tps = [tp for tp in tps if tp <= gpus]
        return tps
    tps = parse_rollout_tps(rollout_tps)
    problems = [p for tp in tps for p in rollout_tp_problems(contract_id, tp, arch.name)]
    if gpus is not None:
        problems += [
            f"rollout TP={tp} needs {tp} CUDA devices; {gpus} visible" for tp in tps if tp > gpus
        ]
    if problems:
        raise LayoutError("invalid --rollout-tps:\n  " + "\n  ".join(problems))
    return tps
