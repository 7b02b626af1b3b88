"""The gate as one call: run, compare, inject faults, build the report, print the table."""

from __future__ import annotations

import time
from pathlib import Path

from .harness import GateConfig, GateRun, run_faults, run_layouts
from .layouts import LayoutError, layout_problems
from .reference import max_abs_diff, reference_logprobs, transformers_reason


def model_name(config: GateConfig) -> str:
    """The profile's name for the gate's model: a covered checkpoint or the reference model."""
    from .rollout import model_arch

    return model_arch(config.contract_id, config.weights)[0].name


def check_layouts(config: GateConfig) -> None:
    """Refuse layouts the contract's model cannot run, before any process starts."""
    model = model_name(config)
    problems = [
        p for lay in config.layouts for p in layout_problems(config.contract_id, lay, model)
    ]
    if problems:
        raise LayoutError("invalid --layouts:\n  " + "\n  ".join(problems))


def run_gate(config: GateConfig) -> dict:
    from ..vendored import load_target

    t0 = time.perf_counter()
    schema = load_target("sglang").schema
    with GateRun(config) as run:
        return _run_gate(run, schema, t0)


def _run_gate(run: GateRun, schema, t0: float) -> dict:
    config = run.config
    layouts = run_layouts(run)
    faults = (
        run_faults(run)
        if config.inject_faults
        else {
            "injected": 0,
            "detected": 0,
            "undetected": [],
            "explained": {},
            "contradicted": [],
            "errors": {},
            "details": {},
        }
    )
    reference, reference_note = None, None
    if isinstance(config.weights, (str, Path)):
        reason = transformers_reason()
        if reason is None:
            first = config.layouts[0]
            base = run.rollout(first.tp)  # the sequences the trainer scored at that layout
            name, ref = reference_logprobs(Path(config.weights), base.sequences, base.prompt_lens)
            trainer = run.trainer(first)[0]
            reference = {"name": name, "max_abs_diff": max_abs_diff(ref, trainer)}
        else:
            reference_note = reason
    else:
        reference_note = "no --checkpoint given (random weights have no Hugging Face counterpart)"
    base = run.rollouts.get(1) or next(iter(run.rollouts.values()))
    total = base.generate_seconds + base.rescore_seconds
    return {
        "contract": config.contract_id,
        "fingerprint": schema.FINGERPRINTS[config.contract_id],
        "logprob_contract": run.logprob_contract,
        "device": config.device,
        "dtype": config.dtype_override or "contract",
        "diagnostic": config.dtype_override is not None,
        "layouts": layouts,
        "faults": faults,
        "reference": reference,
        "reference_note": reference_note,
        "rollout_timing": {
            "generate_seconds": round(base.generate_seconds, 4),
            "rescore_seconds": round(base.rescore_seconds, 4),
            "rescore_share": round(base.rescore_seconds / total, 4) if total else None,
        },
        "seconds": round(time.perf_counter() - t0, 2),
    }


def passed(report: dict) -> bool:
    faults = report["faults"]
    exact = all(lay["exact"] for lay in report["layouts"])
    return exact and not (
        faults["undetected"] or faults.get("errors") or faults.get("contradicted")
    )


def table(report: dict) -> str:
    dtype = report["dtype"] + (
        " (diagnostic: every contract dtype set to it)" if report["diagnostic"] else ""
    )
    lines = [
        f"contract  {report['contract']}  ({report['logprob_contract']} logprobs)",
        f"          {report['fingerprint']}",
        f"device    {report['device']}   dtype {dtype}",
        "",
        f"{'layout':<10}{'tp':>3}{'pp':>3}{'cp':>3}  {'exact':<6}{'tokens':>7}  {'max|diff|':>10}  first divergence",
    ]
    for lay in report["layouts"]:
        fd = lay["first_divergence"]
        where = (
            "-"
            if fd is None
            else f"{fd['module']} token {fd['token_index']} ({fd['rollout']} vs {fd['trainer']})"
        )
        lines.append(
            f"{lay['name']:<10}{lay['tp']:>3}{lay['pp']:>3}{lay['cp']:>3}  {'yes' if lay['exact'] else 'NO':<6}"
            f"{lay['tokens_compared']:>7}  {lay['max_abs_diff']:>10.3g}  {where}"
        )
    f = report["faults"]
    if f["injected"]:
        lines += ["", f"faults    {f['detected']}/{f['injected']} detected"]
        lines += [f"          undetected: {name}" for name in f["undetected"]]
        lines += [f"          error: {name}: {how}" for name, how in f.get("errors", {}).items()]
        lines += [
            f"          listed unobservable but detected: {n}" for n in f.get("contradicted", [])
        ]
        if f.get("explained"):
            lines.append(
                f"          {len(f['explained'])} unobservable by the contract's own notes:"
            )
            lines += [f"            {name}" for name in f["explained"]]
    ref = report["reference"]
    lines.append("")
    lines.append(
        f"reference {ref['name']}: max |diff| {ref['max_abs_diff']:.3g}"
        if ref
        else f"reference none: {report['reference_note']}"
    )
    timing = report["rollout_timing"]
    lines.append(
        f"rollout   generate {timing['generate_seconds']} s, prefill re-score {timing['rescore_seconds']} s"
    )
    lines.append(f"result    {'PASS' if passed(report) else 'FAIL'} ({report['seconds']} s)")
    return "\n".join(lines)
