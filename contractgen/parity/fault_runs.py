"""Fault injection: each policy field flipped on one side must make some layout differ (or be
explained by the contract's ``unobservable`` notes); planted shared-kernel bugs must be caught
by the cross-TP comparison or the transformers reference; undetected faults get a second chance
on the large workload."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..codegen.vendored import load_target
from .compare import compare
from .correctness import rollout_reference, trainer_reference
from .faults import Fault, SharedBug, catalogue, flipped, left_out_reason, shared_bugs
from .gate_run import GateRun, _say
from .layouts import Layout
from .pairs import _policies_at, same_tokens, trainer_for
from .targets import rollout_adapter, rollout_target
from .workload import describe, fitted, scored_tokens


def fault_change(
    run: GateRun, fault: Fault, layout: Layout, rollout_tp: int | None = None
) -> dict[str, Any]:
    """``{field: flipped value}`` of ``fault`` on the policies in force at ``layout`` (the
    rollout's at ``rollout_tp``)."""
    kp, sg, mg = _policies_at(run, layout, rollout_tp)
    owner = kp if fault.kind == "kernel" else {"rollout": sg, "trainer": mg}[fault.side]
    return {fault.field: flipped(fault.field, getattr(owner, fault.field), fault.kind)}


def _try_fault(
    run: GateRun,
    fault: Fault,
    layout: Layout,
    faulted_rollouts: dict | None = None,
    rollout_tp: int | None = None,
) -> tuple[str, str]:
    """("detected" | "undetected" | "error", how) for one fault at one layout (a rollout fault
    with the rollout at ``rollout_tp``, default the layout's TP: the pair the gate compares).

    ``faulted_rollouts`` (``run_faults``' cache, keyed by fault and rollout TP) lets layouts of
    one TP size share one faulted rollout; both sides are deterministic, so re-running it would
    give the same bits."""
    TrainerFault = run.trainer_adapter.TrainerFault

    tp = layout.tp if rollout_tp is None else rollout_tp
    where = layout.name if tp == layout.tp else f"{layout.name} with rollout tp{tp}"
    change = fault_change(run, fault, layout, tp)
    try:
        if fault.side == "rollout":
            # the faulted rollout may sample other tokens: the trainer scores what it sampled
            # (its cached unfaulted run when they are the reference tokens: ``trainer_for``)
            key = (fault.name, tp, tuple(sorted(change.items())))
            cache = {} if faulted_rollouts is None else faulted_rollouts
            if key not in cache:
                cache[key] = run.rollout(tp, **{f"{fault.kind}_changes": change})
            faulted = cache[key]
            rollout = run.scored_rollout(faulted)
            trainer = trainer_for(run, layout, faulted)
        else:
            tf = TrainerFault(**{f"{fault.kind}_policy": change})
            own = run.rollout(layout.tp)
            rollout = run.scored_rollout(own)
            trainer, _ = run.trainer(layout, fault=tf, rollout=own)
    except Exception as exc:  # reported, never counted as a detection
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        return "error", f"{where}: {type(exc).__name__}: {lines[-1][:160] if lines else ''}"
    cmp = compare(rollout, trainer)
    if cmp.exact:
        return "undetected", ""
    return "detected", f"{where}: max |diff| {cmp.max_abs_diff:.3g}"


def unobservable_notes(contract_id: str, run: GateRun | None = None) -> dict[str, str]:
    """The notes on fields the gate cannot observe: the contract's (from the generated schema),
    plus those ``run``'s trainer target declares for its own runtime policy (its adapter's
    ``UNOBSERVABLE``, true under every contract); a contract's own note wins."""

    notes = {}
    if run is not None:
        own = getattr(run.trainer_adapter, "UNOBSERVABLE", {})
        notes = {f"runtime_policy.{run.trainer_target}.{k}": v for k, v in own.items()}
    data = load_target(rollout_target()).schema.CONTRACT_DATA[contract_id]
    return notes | dict(data.get("unobservable", {}))


def _try_shared(run: GateRun, bug: SharedBug, ref, layout: Layout) -> tuple[str, str]:
    """A bug planted on both sides: detected when a rollout TP>1 differs from TP=1 under it, or
    when the rollout (TP=1) or the trainer (``layout``) disagrees with transformers."""

    planted = (bug.bug,)
    try:
        base = run.rollout(1, planted_bugs=planted)
        for tp in [t for t in run.config.rollout_tps if t > 1]:
            other = run.rollout(tp, planted_bugs=planted)
            if not same_tokens(base, other):
                return "detected", f"rollout tp{tp} sampled other tokens than tp1"
            cmp = compare(run.scored_rollout(base), run.scored_rollout(other))
            if not cmp.exact:
                return "detected", f"rollout tp{tp} vs tp1: max |diff| {cmp.max_abs_diff:.3g}"
        if ref is None:
            off = "--no-reference" if not run.config.hf_reference else "transformers not there"
            return "left out", (
                "a bug on both sides moves no rollout-vs-trainer bit and no rollout TP > 1 "
                f"differed from TP 1 (TPs {sorted(run.config.rollout_tps)}); the one check "
                f"left, transformers' forward, is off in this run ({off})"
            )
        for entry in (
            rollout_reference(run, ref, 1, planted),
            trainer_reference(run, ref, layout, planted),
        ):
            if not entry["within_tolerance"]:
                return "detected", f"{entry['name']} vs transformers: {entry['max_abs_diff']:.3g}"
    except Exception as exc:  # reported, never counted as a detection
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        return "error", f"{type(exc).__name__}: {lines[-1][:160] if lines else ''}"
    return "undetected", ""


def run_faults(run: GateRun, ref=None, trainer_only: bool = False) -> dict:
    """Flip each field on one side; a fault is tried layout by layout, cheapest first, until
    one differs. Layout-major, so only one layout's trainer processes are alive at a time.
    Then each shared-kernel bug is planted on both sides (``_try_shared``). ``trainer_only``
    (a second trainer target's run): its trainer-side faults alone, the kernel ones named by it.

    A fault no layout detects fails the gate unless the contract explains it under
    ``unobservable``; a fault the contract calls unobservable that IS detected fails it too.
    """
    # cheapest first; among layouts of one size, TP first (reduction-order faults need TP)
    layouts = sorted(run.layouts, key=lambda lay: (lay.world_size, -lay.tp, lay.name))
    kp, sg, mg = _policies_at(run, layouts[0])
    faults = catalogue(kp, sg, mg, rollout_target(), run.trainer_target, trainer_only)
    if trainer_only:
        faults = [f for f in faults if f.side == "trainer"]
    left_out = _left_out(run, layouts, faults)
    faults = [f for f in faults if f.name not in left_out]
    notes = unobservable_notes(run.config.contract_id, run)
    outcomes: dict[str, tuple[str, str]] = {f.name: ("undetected", "") for f in faults}
    faulted_rollouts: dict = {}  # (fault, rollout TP) -> its rollout, shared by layouts of one TP
    for layout in layouts:
        for tp in [t for t in run._rollout_sessions if t != layout.tp]:
            run.release_rollout(tp)  # memory: one rollout TP's processes at a time
        pending = [f for f in faults if outcomes[f.name][0] == "undetected"]
        for fault in pending:
            outcomes[fault.name] = _try_fault(run, fault, layout, faulted_rollouts)
        run.release(layout)
        if run.config.progress:
            left = sum(1 for o, _ in outcomes.values() if o == "undetected")
            _say(f"faults at {layout.name}: {len(pending)} tried, {left} not yet detected")
    _try_other_rollout_tps(run, faults, layouts[0], outcomes, faulted_rollouts)
    for bug in [] if trainer_only else shared_bugs():
        outcomes[bug.name] = _try_shared(run, bug, ref, layouts[0])
        faults.append(bug)
    run.close()
    unexplained = [
        f
        for f in faults
        if isinstance(f, Fault)
        and outcomes[f.name][0] == "undetected"
        and f.contract_path not in notes
    ]
    retried = _retry_on_large_workload(run, unexplained, layouts[0], outcomes)
    detected, undetected, explained, contradicted, errors, details = [], [], {}, [], {}, {}
    for i, fault in enumerate(faults):
        outcome, how = outcomes[fault.name]
        note = notes.get(fault.contract_path)
        if outcome == "left out":
            left_out[fault.name] = how
        elif outcome == "detected":
            detected.append(fault.name)
            if note is not None:
                contradicted.append(fault.name)
                how += f" (but the contract lists {fault.contract_path} as unobservable)"
        elif outcome == "error":
            errors[fault.name] = how
        elif note is not None:
            explained[fault.name] = note
            outcome = "explained"
        else:
            undetected.append(fault.name)
        if not how:
            how = f"no layout of {[lay.name for lay in layouts]} differs"
            if retried and fault.name in retried["faults"]:
                how += f", nor {retried['layout']} on the {retried['workload']} workload"
                if fault.side == "rollout" and len(retried.get("rollout_tps", [1])) > 1:
                    how += f" (rollout TPs {retried['rollout_tps']})"
        details[fault.name] = how
        if run.config.progress:
            _say(f"fault {i + 1}/{len(faults)} {fault.name}: {outcome} {how}".rstrip())
    return {
        "injected": len(faults),
        "detected": len(detected),
        "undetected": undetected,
        "explained": explained,
        "contradicted": contradicted,
        "errors": errors,
        "details": details,
        "retried": retried,
        "left_out": left_out,
    }


def _left_out(run: GateRun, layouts: list[Layout], faults: list[Fault]) -> dict[str, str]:
    """``{fault: why}`` for the kernel faults nothing in this run could show: each acts only
    across the ranks of one axis (``faults.AXIS_ONLY_FIELDS``) and its side runs none above 1.
    The trainer's sizes are its layouts'; the rollout's TP is any of the gate's rollout TPs
    (``_try_other_rollout_tps`` pairs them with a trainer layout), its EP the layouts'."""
    names = [lay.name for lay in layouts]
    trainer = {"tp": max(lay.tp for lay in layouts), "ep": max(lay.ep for lay in layouts)}
    rollout_tps = sorted({*run.config.rollout_tps, *(lay.tp for lay in layouts)})
    sides = {
        "trainer": (trainer, f"{run.trainer_target} layouts {', '.join(names)}"),
        "rollout": ({**trainer, "tp": max(rollout_tps)}, f"rollout TPs {rollout_tps}"),
    }
    out = {}
    for fault in faults:
        sizes, where = sides[fault.side]
        why = fault.kind == "kernel" and left_out_reason(fault.field, fault.side, sizes, where)
        if why:
            out[fault.name] = why
    return out


def _try_other_rollout_tps(
    run: GateRun, faults: list[Fault], layout: Layout, outcomes: dict, faulted_rollouts: dict
) -> None:
    """A rollout fault no layout showed at its own TP, tried with ``layout``'s trainer against
    the gate's other rollout TPs, largest first (pairs the gate compares too: ``pairs``). The
    rollout's cross-rank switches act only at TP > 1, and a trainer without TP (``fsdpN``)
    pairs with rollout TP 1 alone."""
    pending = [f for f in faults if f.side == "rollout" and outcomes[f.name][0] == "undetected"]
    own = {lay.tp for lay in run.layouts}
    for tp in sorted({*run.config.rollout_tps} - own, reverse=True):
        for fault in [f for f in pending if outcomes[f.name][0] == "undetected"]:
            outcomes[fault.name] = _try_fault(run, fault, layout, faulted_rollouts, tp)
        run.release_rollout(tp)
        if run.config.progress:
            left = sum(1 for f in pending if outcomes[f.name][0] == "undetected")
            _say(f"faults at {layout.name} with rollout tp{tp}: {left} not yet detected")
    run.release(layout)


def merged_faults(first: dict, other: dict) -> dict:
    """One ``faults`` section of two ``run_faults`` results (two trainer targets' runs)."""
    out = dict(first)
    for key in ("injected", "detected", "undetected", "contradicted"):
        out[key] = first[key] + other[key]
    for key in ("explained", "errors", "details", "left_out"):
        out[key] = {**first.get(key, {}), **other.get(key, {})}
    a, b = first.get("retried"), other.get("retried")
    if a and b:
        out["retried"] = {
            **a,
            "faults": a["faults"] + b["faults"],
            "detected": a["detected"] + b["detected"],
        }
    else:
        out["retried"] = a or b
    return out


RETRY_WORKLOAD = "large"


def _retry_on_large_workload(
    run: GateRun, faults: list[Fault], layout: Layout, outcomes: dict[str, tuple[str, str]]
) -> dict | None:
    """Give each fault no layout detected a second chance at ``layout`` on the ``large``
    workload (when it is larger than the run's own), updating ``outcomes``.

    A reordered float32 reduction moves a float32 logprob by an ulp on a few percent of tokens
    (``logsoftmax_vocab_block`` under float32 logprobs: about 1 in 25), so the default 40 scored
    tokens can miss it; 256 cannot, in practice. Only the undetected, unexplained faults pay for
    the larger workload. A rollout fault still undetected there is tried once more with the
    rollout at the gate's largest TP: a cross-rank switch (a reduce-scatter's float32 order,
    one rounding later) acts only at TP > 1 and moves a bfloat16 value only where the two float32
    sums straddle a rounding boundary."""

    config = run.config
    max_positions = (
        rollout_adapter().arch_of(config.contract_id, config.weights).max_position_embeddings
    )
    workload = fitted(RETRY_WORKLOAD, max_positions)
    if not faults or scored_tokens(workload) <= scored_tokens(config.workload):
        return None
    what = f"{layout.name} on the {RETRY_WORKLOAD} workload ({describe(RETRY_WORKLOAD)})"
    if config.progress:
        _say(f"faults: {len(faults)} undetected; trying them at {what}")
    top = max(config.rollout_tps, default=1)
    rollout_tps = [1, top] if top > 1 and any(f.side == "rollout" for f in faults) else [1]
    big = replace(config, workload=workload, layouts=[layout], rollout_tps=rollout_tps)
    with GateRun(big, trainer_target=run.trainer_target) as big_run:
        for fault in faults:
            outcome, how = _try_fault(big_run, fault, layout)
            if outcome == "undetected" and fault.side == "rollout" and top > 1:
                outcome, how = _try_fault(big_run, fault, layout, rollout_tp=top)
            if outcome != "undetected":
                outcomes[fault.name] = (outcome, f"{how}, on the {RETRY_WORKLOAD} workload")
    return {
        "workload": RETRY_WORKLOAD,
        "layout": layout.name,
        "rollout_tps": rollout_tps,
        "faults": [f.name for f in faults],
        "detected": [f.name for f in faults if outcomes[f.name][0] == "detected"],
    }
