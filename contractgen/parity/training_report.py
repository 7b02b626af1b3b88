"""The report of a ``--train-steps`` run: why it fails (``failures``) and its table."""

from __future__ import annotations

import struct

from .sampling_check import three_way_failures
from .training_step import (
    _synced,
)


def _bits(x: float) -> bytes:
    """A float's bit pattern (``-0.0 == 0.0`` as values)."""
    return struct.pack("<d", x)


def failures(report: dict) -> list[str]:
    """Why a training run fails (empty: it passes)."""
    out = []
    for s in report["steps"]:
        out += [f"step {s['step']}: {p['name']} not exact" for p in s["pairs"] if not p["exact"]]
        out += three_way_failures(s)
        if s["ratio_max_abs_dev"] != 0.0:
            out.append(f"step {s['step']}: importance ratio off 1 by {s['ratio_max_abs_dev']:.3g}")
        out += [
            f"step {s['step']}: {e['name']}: loss {e['loss']!r} is not its value at ratio 1, "
            f"{e['loss_if_ratio_one']!r}"
            for e in s["per_layout"]
            if _bits(e["loss"]) != _bits(e["loss_if_ratio_one"])
        ]
        out += [
            f"step {s['step']}: {e['name']}: the trainer's advantage-weighted logprob "
            f"{e['advantage_logprob']!r} is not the step's ({e['advantage_logprob_want']!r} +- "
            f"{e['advantage_logprob_bound']:.2g}): the advantages it applied are not the ones "
            "sent for its sequences"
            for e in s["per_layout"]
            if not abs(e["advantage_logprob"] - e["advantage_logprob_want"])
            <= e["advantage_logprob_bound"]
        ]
        grads = s.get("grads")
        if grads is not None:
            out += [
                f"step {s['step']}: gradients at {g['name']} off float64 "
                f"({g['max_rel_diff']:.3g} > {grads['tolerance']})"
                for g in grads["per_layout"]
                if g.get("supported", True) and not g["within_tolerance"]
            ]
        out += [
            f"step {s['step']}: {e['name']}: rollout weights differ from the trainer's: "
            + "; ".join(f"{tp} {', '.join(names[:3])}" for tp, names in e["stale"].items())
            for e in s["per_layout"]
            if not e["weights_synced"]
        ]
        out += [
            f"step {s['step']}: {e['name']}: adapter digest mismatch: rollout {tp} serves "
            f"{_short(e['adapter']['served'][tp])}, the trainer pushed "
            f"{_short(e['adapter']['pushed'])} ({why})"
            for e in s["per_layout"]
            if e.get("adapter") and not e["adapter"]["synced"]
            for tp, why in e["adapter"]["mismatch"].items()
        ]
        out += [
            f"step {s['step']}: {e['name']}: data-parallel replicas differ after the step: "
            + ", ".join(e["dp_mismatched"][:3])
            + (f" (+{len(e['dp_mismatched']) - 3} more)" if len(e["dp_mismatched"]) > 3 else "")
            for e in s["per_layout"]
            if not e.get("dp_replicas_identical", True)
        ]
    return out


def _short(digest: str | None) -> str:
    return "no adapter" if digest is None else f"sha256:{digest[:12]}"


def table(report: dict) -> list[str]:
    """The text table's training lines: one per step."""
    t = report["training"]
    lines = [
        f"training  {t['steps']} steps; {t['prompts_per_step']} prompts x {t['group_size']} "
        f"samples, {t['new_tokens']} new tokens each"
        + (
            f", {t['microbatches']} microbatches per DP rank"
            if t.get("microbatches", 1) > 1
            else ""
        ),
        f"          {t['task']}",
        f"          {t['loss']}; {t['optimizer']}",
    ]
    if t["fault"]:
        lines.append(f"fault     {t['fault']} (one side only: must FAIL)")
    if t.get("planted_bugs"):
        lines.append(f"planted   {', '.join(t['planted_bugs'])} (on both sides: must FAIL)")
    lines += [
        "",
        f"{'step':<6}{'pairs exact':>12}  {'max|ratio-1|':>12}  {'kl':>9}  {'loss':>9}  "
        f"{'reward':>7}  {'3-way':>5}  weights",
    ]
    for s in report["steps"]:
        exact = f"{sum(p['exact'] for p in s['pairs'])}/{len(s['pairs'])}"
        lines.append(
            f"{s['step']:<6}{exact:>12}  {s['ratio_max_abs_dev']:>12.3g}  "
            f"{s['kl']:>9.3g}  {s['loss']:>9.4f}  {s['reward_mean']:>7.3f}  "
            f"{s['three_way']['mismatch_count']:>5}  "
            f"{'synced' if _synced(s) else 'NOT synced'}"
        )
    lines += _push_lines(report)
    lines += _grads_lines(report)
    return lines


def _push_lines(report: dict) -> list[str]:
    """Under LoRA: what each step's push carried, and the adapter handshake."""
    steps = report["steps"]
    if not any(e.get("adapter") for s in steps for e in s["per_layout"]):
        return []
    out = ["", "push      (bytes per push; full = base + adapter; adapter sha256 pushed / served)"]
    for s in steps:
        p = s["push"]
        what = "adapter only" if p["adapter_only"] else "base + adapter"
        digests = {e["adapter"]["pushed"] for e in s["per_layout"]}
        verdict = "served" if s["adapter_synced"] else "MISMATCH"
        digest = _short(next(iter(digests))) if len(digests) == 1 else f"{len(digests)} adapters"
        out.append(
            f"step {s['step']:<3}{what:<15}{p['bytes']:>10} of {p['full_bytes']:>10} bytes "
            f"({p['fraction']:.2%})  {digest} {verdict}"
        )
    return out


def _grads_lines(report: dict) -> list[str]:
    """The step-0 gradient check's lines (none with ``--no-grad-check``)."""
    out = []
    for s in report["steps"]:
        grads = s.get("grads")
        if grads is None:
            continue
        out += [
            "",
            f"grads     step {s['step']}: {grads['dtype']}, {grads['loss']}, "
            f"tolerance {grads['tolerance']} (relative)",
        ]
        if grads["note"]:
            out.append(f"          none: {grads['note']}")
        for g in grads["per_layout"]:
            if not g.get("supported", True):
                out.append(f"          {g['name']:<10} {g['note']}")
                continue
            verdict = "ok" if g["within_tolerance"] else "OFF"
            out.append(f"          {g['name']:<10} max rel {g['max_rel_diff']:.3g}  {verdict}")
    return out
