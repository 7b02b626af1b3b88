"""The gate as one call: run, compare, inject faults, build the report, print the table."""

from __future__ import annotations

import time

from ..codegen.vendored import load_target
from . import kernel_audit, rollout_targets
from .correctness import (
    GRAD_TOLERANCE,
    grad_reference,
    reference_for,
    reference_report,
    rollout_reference,
)
from .harness import GateConfig, GateRun, merged_faults, run_faults, run_layouts, run_rollouts
from .layouts import LayoutError, layout_problems
from .sampling_check import failures as sampling_failures
from .sampling_check import sampling_report
from .sampling_check import table as sampling_table
from .targets import rollout_adapter, rollout_target
from .training import failures as training_failures
from .training import run_training
from .training import table as training_table


def model_name(config: GateConfig) -> str:
    """The profile's name for the gate's model: a covered checkpoint or the reference model."""

    return rollout_adapter().arch_of(config.contract_id, config.weights).name


def check_layouts(config: GateConfig) -> None:
    """Refuse layouts the contract's model cannot run, before any process starts."""
    model = model_name(config)
    problems = [
        p for lay in config.layouts for p in layout_problems(config.contract_id, lay, model)
    ]
    requests = len(config.workload)
    problems += [
        f"{lay.name}: its {lay.ep_dp} data-parallel ranks score a request each at least; the "
        f"workload has {requests} (raise --requests)"
        for lay in config.layouts
        if lay.ep_dp > requests
    ]
    if problems:
        raise LayoutError("invalid --layouts:\n  " + "\n  ".join(problems))


def run_gate(config: GateConfig) -> dict:
    t0 = time.perf_counter()
    schema = load_target(rollout_target()).schema
    with GateRun(config) as run:
        if config.training is not None:
            return _run_training(run, schema, t0)
        return _run_gate(run, schema, t0)


NO_FAULTS = {
    "injected": 0,
    "detected": 0,
    "undetected": [],
    "explained": {},
    "contradicted": [],
    "errors": {},
    "details": {},
    "retried": None,
}


def _run_training(run: GateRun, schema, t0: float) -> dict:
    config = run.config
    report = {
        "contract": config.contract_id,
        "fingerprint": schema.FINGERPRINTS[config.contract_id],
        "logprob_contract": run.logprob_contract,
        "device": config.device,
        "dtype": config.dtype_override or "contract",
        "diagnostic": config.dtype_override is not None,
        "rollout_tps": sorted({1, *config.rollout_tps}),
        "trainers": [run.trainer_target],
        "layouts": [{"name": lay.name, **lay.sizes} for lay in config.layouts],
        **run_training(run, config.training),
    }
    report["seconds"] = round(time.perf_counter() - t0, 2)
    return report


def _run_gate(run: GateRun, schema, t0: float) -> dict:
    config = run.config
    ref, reference_note = reference_for(config)
    rollouts = run_rollouts(run)
    ref_rollouts = []
    if ref is not None:
        ref_rollouts = [rollout_reference(run, ref, tp) for tp in config.rollout_tps]
    for tp in config.rollout_tps:
        if tp > 1:
            run.release_rollout(tp)  # results are cached; memory for the trainer's processes
    grad_ref, grads_note = grad_reference(run) if config.grads else (None, None)
    checked: dict[str, list] = {"layouts": [], "pairs": [], "reference": [], "grads": []}
    for trainer in config.trainer_targets:  # each trainer target against the same rollouts
        run.use_trainer(trainer)
        for key, entries in run_layouts(run, ref, grad_ref).items():
            checked[key] += entries
    rollout_targets.label_pairs(checked["pairs"])
    targets = rollout_targets.report(run)
    checked["pairs"] += targets["pairs"]
    run.use_trainer(config.trainer_targets[0])
    sampling, three_way = sampling_report(run)
    faults = run_faults(run, ref) if config.inject_faults else NO_FAULTS
    for trainer in config.trainer_targets[1:] if config.inject_faults else ():
        run.use_trainer(trainer)  # the rollout's faults ran once, with the first trainer
        faults = merged_faults(faults, run_faults(run, ref, trainer_only=True))
    run.use_trainer(config.trainer_targets[0])
    base = run.rollouts[1]
    total = base.generate_seconds + base.rescore_seconds
    grads = None
    if config.grads:
        grads = {
            "dtype": "float32 trainer vs float64 transformers autograd",
            "loss": "minus the sum of the scored (response) tokens' logprobs",
            "tolerance": GRAD_TOLERANCE,
            "tolerance_meaning": "max |grad - float64 grad| / max |float64 grad|, per parameter",
            "note": grads_note,
            "per_layout": checked["grads"],
        }
    return {
        "contract": config.contract_id,
        "fingerprint": schema.FINGERPRINTS[config.contract_id],
        "logprob_contract": run.logprob_contract,
        "device": config.device,
        "dtype": config.dtype_override or "contract",
        "diagnostic": config.dtype_override is not None,
        "planted_bugs": list(config.planted_bugs),
        "workload": {
            "requests": len(config.workload),
            "prompt_tokens": [w.prompt_len for w in config.workload],
            "new_tokens": [w.max_new_tokens for w in config.workload],
        },
        "rollout_tps": list(config.rollout_tps),
        "trainers": list(config.trainer_targets),
        "rollout_tokens_identical": rollouts["rollout_tokens_identical"],
        "rollouts": rollouts["rollouts"],
        "rollout_targets": targets["rollout_targets"],
        "layouts": checked["layouts"],
        "pairs": checked["pairs"],
        "sampling": sampling,
        "three_way": three_way,
        "faults": faults,
        "reference": (
            reference_report(ref, ref_rollouts + checked["reference"]) if ref is not None else None
        ),
        "reference_note": reference_note,
        "grads": grads,
        "kernel_calls": kernel_audit.section(run),
        "rollout_timing": {
            "generate_seconds": round(base.generate_seconds, 4),
            "rescore_seconds": round(base.rescore_seconds, 4),
            "rescore_share": round(base.rescore_seconds / total, 4) if total else None,
        },
        "seconds": round(time.perf_counter() - t0, 2),
    }


def failures(report: dict) -> list[str]:
    """Why the gate fails (empty: it passes)."""
    if "steps" in report:
        return training_failures(report)
    out = [f"layout {lay['name']} {_inexact(lay)}" for lay in report["layouts"] if not lay["exact"]]
    out += [f"{p['name']} {_inexact(p)}" for p in report["pairs"] if not p["exact"]]
    if not report["rollout_tokens_identical"]:
        out.append("rollout token ids differ across rollout TPs")
    out += [
        f"rollout tp{r['tp']} logprobs differ from tp1"
        for r in report["rollouts"]
        if r["tokens_identical"] and not r["logprobs_exact"]
    ]
    ref = report["reference"]
    if ref is not None:
        out += [
            f"{e['name']} disagrees with transformers ({e['max_abs_diff']:.3g} > "
            f"{ref['tolerance']})"
            for e in ref["per_layout"]
            if not e["within_tolerance"]
        ]
        first = ref["per_layout"][0]["name"]
        out += [
            f"float32 {n} differs bitwise from float32 {first} (one kernel library: must not)"
            for n in ref.get("float32_bits_differ_from_first", [])
        ]
    grads = report.get("grads")
    if grads is not None:
        out += [
            f"gradients at {g['name']} off float64 ({g['max_rel_diff']:.3g} > "
            f"{grads['tolerance']})"
            for g in grads["per_layout"]
            if g["supported"] and not g["within_tolerance"]
        ]

    out += sampling_failures(report)
    faults = report["faults"]
    out += [f"fault undetected: {n}" for n in faults["undetected"]]
    out += [f"fault error: {n}" for n in faults.get("errors", {})]
    out += [f"fault listed unobservable but detected: {n}" for n in faults.get("contradicted", [])]
    out += kernel_audit.failures(report)
    out += rollout_targets.failures(report)
    return out


def _inexact(entry: dict) -> str:
    """Why a layout or pair is not exact: other bits, or nothing compared (which proves nothing)."""
    if entry["tokens_compared"] == 0:
        return "compared no tokens (an empty comparison proves nothing)"
    return "not exact"


def passed(report: dict) -> bool:
    return not failures(report)


def _header(report: dict) -> list[str]:
    dtype = report["dtype"] + (
        " (diagnostic: every contract dtype set to it)" if report["diagnostic"] else ""
    )
    return [
        f"contract  {report['contract']}  ({report['logprob_contract']} logprobs)",
        f"          {report['fingerprint']}",
        f"device    {report['device']}   dtype {dtype}",
        # several trainer targets: named (one keeps the table as it was)
        *(
            [
                f"trainers  {', '.join(report['trainers'])} (each paired with the rollout; layouts of "
                f"all but the first are named <trainer>/<layout>)"
            ]
            if len(report.get("trainers", [])) > 1
            else []
        ),
    ]


def _footer(report: dict) -> list[str]:
    why = failures(report)
    return [f"          {w}" for w in why[:12]] + [
        f"result    {'PASS' if not why else 'FAIL'} ({report['seconds']} s)"
    ]


def table(report: dict) -> str:
    """The report as the text table ``parity`` prints."""
    if "steps" in report:
        layouts = ", ".join(lay["name"] for lay in report["layouts"])
        return "\n".join(
            [
                *_header(report),
                f"layouts   trainer {layouts}; rollout TP {report['rollout_tps']}",
                *training_table(report),
                "",
                *_footer(report),
            ]
        )
    lines = [*_header(report), "", *_layout_lines(report)]
    f = report["faults"]
    if f["injected"]:
        lines += ["", *_fault_lines(f)]
    lines += _rollout_lines(report)
    lines += sampling_table(report)
    lines += _reference_lines(report)
    lines += _grads_lines(report)
    if report.get("planted_bugs"):
        lines.append(f"planted   {', '.join(report['planted_bugs'])} (on both sides: must FAIL)")
    lines += kernel_audit.table(report)
    timing = report["rollout_timing"]
    lines.append(
        f"rollout   generate {timing['generate_seconds']} s, prefill re-score {timing['rescore_seconds']} s"
    )
    lines += _footer(report)
    return "\n".join(lines)


def _layout_lines(report: dict) -> list[str]:
    """One row per trainer layout: sizes, exact, tokens, max |diff|, first divergence."""
    # the EP column only when some layout has expert parallelism (dense reports keep their shape)
    has_ep = any(lay.get("ep", 1) > 1 for lay in report["layouts"])
    ep_head = f"{'ep':>3}" if has_ep else ""

    def ep_cell(lay: dict) -> str:
        return f"{lay.get('ep', 1):>3}" if has_ep else ""

    lines = [
        f"{'layout':<10}{'tp':>3}{'pp':>3}{'cp':>3}{ep_head}  {'exact':<6}{'tokens':>7}  "
        f"{'max|diff|':>10}  first divergence",
    ]
    for lay in report["layouts"]:
        fd = lay["first_divergence"]
        where = (
            "-"
            if fd is None
            else f"{fd['module']} token {fd['token_index']} ({fd['rollout']} vs {fd['trainer']})"
        )
        lines.append(
            f"{lay['name']:<10}{lay['tp']:>3}{lay['pp']:>3}{lay['cp']:>3}"
            f"{ep_cell(lay)}  {'yes' if lay['exact'] else 'NO':<6}"
            f"{lay['tokens_compared']:>7}  {lay['max_abs_diff']:>10.3g}  {where}"
        )
    return lines


def _fault_lines(f: dict) -> list[str]:
    """The faults section: detected, retried, undetected, left out, errors, explained."""
    lines = [f"faults    {f['detected']}/{f['injected']} detected"]
    retried = f.get("retried")
    if retried:
        lines.append(
            f"          {len(retried['detected'])}/{len(retried['faults'])} of those no layout "
            f"saw, seen at {retried['layout']} on the {retried['workload']} workload"
        )
    lines += [f"          undetected: {name}" for name in f["undetected"]]
    lines += [f"          left out: {n}: {why}" for n, why in f.get("left_out", {}).items()]
    lines += [f"          error: {name}: {how}" for name, how in f.get("errors", {}).items()]
    lines += [f"          listed unobservable but detected: {n}" for n in f.get("contradicted", [])]
    if f.get("explained"):
        lines.append(f"          {len(f['explained'])} unobservable by the contract's own notes:")
        lines += [f"            {name}" for name in f["explained"]]
    return lines


def _rollout_lines(report: dict) -> list[str]:
    """Every rollout TP against the TP=1 reference, and the pairs' verdict."""
    lines = [
        "",
        f"rollout   TP {report['rollout_tps']} vs the TP=1 reference: token ids "
        f"{'identical' if report['rollout_tokens_identical'] else 'DIFFER'}",
    ]
    for r in report["rollouts"]:
        if r["tokens_identical"] and not r["logprobs_exact"]:
            lines.append(
                f"          tp{r['tp']}: logprobs differ (max |diff| {r['max_abs_diff']:.3g})"
            )
    bad = [p for p in report["pairs"] if not p["exact"]]
    lines.append(
        f"pairs     {len(report['pairs']) - len(bad)}/{len(report['pairs'])} exact "
        "(every rollout TP x every trainer layout)"
    )
    lines += [f"          NOT exact: {p['name']} (max |diff| {p['max_abs_diff']:.3g})" for p in bad]
    return lines


def _reference_lines(report: dict) -> list[str]:
    """The transformers reference: each run's max |diff| and the float32 bits' agreement."""
    ref = report["reference"]
    lines = [""]
    if not ref:
        return [*lines, f"reference none: {report['reference_note']}"]
    lines.append(
        f"reference {ref['name']}, sequences {ref['sequence_lengths']} tokens, "
        f"tolerance {ref['tolerance']}"
    )
    lines += [
        f"          {e['name']:<22} max |diff| {e['max_abs_diff']:.3g}"
        f"{'' if e['within_tolerance'] else '  OUT OF TOLERANCE'}"
        for e in ref["per_layout"]
    ]
    split = ref.get("float32_bits_differ_from_first", [])
    lines.append(
        f"float32   {len(ref['per_layout']) - len(split)}/{len(ref['per_layout'])} runs with "
        f"the bits of {ref['per_layout'][0]['name']}"
        + (f"; DIFFER: {', '.join(split)}" if split else "")
    )
    return lines


def _grads_lines(report: dict) -> list[str]:
    """``--grads``: each layout's gradient against float64 autograd."""
    grads = report.get("grads")
    if grads is None:
        return []
    lines = [f"grads     {grads['dtype']}, tolerance {grads['tolerance']} (relative)"]
    if grads["note"]:
        lines.append(f"          none: {grads['note']}")
    for g in grads["per_layout"]:
        how = (
            f"max rel diff {g['max_rel_diff']:.3g}"
            + ("" if g["within_tolerance"] else "  OUT OF TOLERANCE")
            if g["supported"]
            else g["note"]
        )
        lines.append(f"          {g['name']:<10} {how}")
    return lines
