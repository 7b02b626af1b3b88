"""On-policy sampling in the one-shot gate: each sampled token's logprob as the sampler saw it
(decode time, after temperature / top-k / top-p) against what the trainer scores.

``sampling[]`` has one entry per request of the reference rollout (TP=1): its sampling params, its
tokens, per token the sampler's, the re-score's and the first layout's trainer logprob, and the
worst ``|sampler - trainer|`` over every trainer layout. Under a ``decode`` logprob contract the
sampler's logprob IS the one trained on, so it must equal the trainer's bit for bit; under
``sglang_prefill`` the trainer equals the re-score (the layouts' check) and the sampler's logprob
may differ from it by at most ``SAMPLING_BOUND`` per token: above it the tokens were drawn from
another distribution than the one scored (a decode-only position error, a sampler ignoring the
temperature), and the gate fails.

``three_way`` counts, per trainer layout, the tokens whose float32 bit patterns differ between
each two of: the sampler's logprob, the re-score, the trainer's.
"""

from __future__ import annotations

from typing import Any

import torch

# Per-token |sampler logprob - trainer logprob| the gate allows, by logprob contract. "decode":
# none (bitwise). "sglang_prefill": 0.05 nats, under two bfloat16 ulps of a logprob in [-8, -4)
# (one is 0.031): a re-score that rounds a decode logprob a step away passes, a sampler drawing
# from another distribution does not (a decode-only RoPE position error of one: 0.11 to 0.30 on
# the default workload). Honest runs measure 0 here: decode and re-score share every kernel.
SAMPLING_BOUND = {"decode": 0.0, "sglang_prefill": 0.05}


def bits32(t: torch.Tensor) -> torch.Tensor:
    """Float32 bit patterns of ``t`` (exact for bfloat16 / float32 logprobs)."""
    return t.float().contiguous().view(torch.int32)


def _absdiff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    d = (a.double() - b.double()).abs()
    return torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)


def _mismatches(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((bits32(a) != bits32(b)).sum())


def three_way_counts(decode, rescore, trainer) -> dict:
    """Tokens whose float32 bits differ, each pair of the three (per-sequence tensor lists)."""
    dec, res, tr = (torch.cat([t.reshape(-1) for t in x]) for x in (decode, rescore, trainer))
    all_three = (bits32(dec) == bits32(res)) & (bits32(res) == bits32(tr))
    return {
        "tokens": int(dec.numel()),
        "decode_vs_trainer": _mismatches(dec, tr),
        "rescore_vs_trainer": _mismatches(res, tr),
        "decode_vs_rescore": _mismatches(dec, res),
        "mismatch_count": int((~all_three).sum()),
    }


def sampling_report(run: Any) -> tuple[list[dict], dict]:
    """``(sampling[], three_way)`` of a gate run whose layouts ran (see the module docstring)."""
    base = run.rollouts[1]
    contract = run.logprob_contract
    bound = SAMPLING_BOUND[contract]
    layouts = [lay.name for lay in run.config.layouts if lay.name in run.trainers]
    entries = []
    for i, (spec, params) in enumerate(zip(run.config.workload, base.sampling, strict=True)):
        dec, res = base.decode_logprobs[i], base.prefill_logprobs[i]
        trained = [run.trainers[name][i] for name in layouts]
        diffs = [_absdiff(dec, t) for t in trained]
        worst = torch.stack(diffs).amax(0) if diffs else torch.zeros(dec.numel())
        exact = bool(trained) and all(torch.equal(bits32(dec), bits32(t)) for t in trained)
        max_diff = float(worst.max()) if worst.numel() else 0.0
        entries.append(
            {
                "rid": spec.rid,
                "temperature": params.temperature,
                "top_k": params.top_k,
                "top_p": params.top_p,
                "seed": spec.seed,
                "tokens": base.sequences[i][base.prompt_lens[i] :],
                "sampler_logprobs": dec.float().tolist(),
                "rescore_logprobs": res.float().tolist(),
                "trainer_logprobs": trained[0].float().tolist() if trained else None,
                "trainer_layout": layouts[0] if layouts else None,
                "abs_diff": worst.tolist(),
                "max_abs_diff": max_diff,
                "exact": exact,
                "bound": bound,
                "within_bound": bool(trained) and (exact or (bound > 0 and max_diff <= bound)),
            }
        )
    per_layout = [
        {
            "name": name,
            **three_way_counts(base.decode_logprobs, base.prefill_logprobs, run.trainers[name]),
        }
        for name in layouts
    ]
    three_way = {
        "bits": "float32",
        "sides": "sampler (decode-time, processed) logprob, prefill re-score, trainer",
        "logprob_contract": contract,
        "per_layout": per_layout,
        "mismatch_count": max((e["mismatch_count"] for e in per_layout), default=0),
    }
    return entries, three_way


def failures(report: dict) -> list[str]:
    """Requests whose sampler logprobs are off the trainer's beyond the bound."""
    return [
        f"sampling {e['rid']} (T={e['temperature']}, top_k={e['top_k']}, top_p={e['top_p']}): "
        f"sampler logprob off the trainer's by {e['max_abs_diff']:.3g} "
        f"({'must be bitwise equal' if e['bound'] == 0 else 'bound ' + str(e['bound'])})"
        for e in report.get("sampling") or []
        if not e["within_bound"]
    ]


def table(report: dict) -> list[str]:
    """The text table's sampling lines."""
    entries = report.get("sampling")
    if not entries:
        return []
    tw = report["three_way"]
    bound = entries[0]["bound"]
    rule = "bitwise" if bound == 0 else f"bound {bound} per token"
    bad = [e for e in entries if not e["within_bound"]]
    worst = max(e["max_abs_diff"] for e in entries)
    lines = [
        f"sampling  {len(entries) - len(bad)}/{len(entries)} requests: sampler logprob vs trainer "
        f"{rule}, max |diff| {worst:.3g}",
        f"          three-way (float32 bits; sampler, re-score, trainer): "
        f"{tw['mismatch_count']} tokens not all equal",
    ]
    lines += [f"          OFF: {e['rid']} max |diff| {e['max_abs_diff']:.3g}" for e in bad]
    return lines


# ---- the RL loop (``--train-steps``): steps[].three_way ------------------------------------------
def step_three_way(
    contract: str, base: Any, trainer_logprobs: list, trainer_digest: str, syncs: dict, step: int
) -> dict:
    """One layout's step: the sampler's logprobs (``base``, the TP=1 rollout), the re-score and
    the trainer's first forward of the step (the training forward, before the update), in float32
    bits; and the weights each side used: the trainer's (``trainer_digest``, what it held at that
    forward) and each rollout TP's (the digest of what its ranks hold, gathered back)."""
    counts = three_way_counts(base.decode_logprobs, base.prefill_logprobs, trainer_logprobs)
    diffs = [_absdiff(d, t) for d, t in zip(base.decode_logprobs, trainer_logprobs, strict=True)]
    worst = max((float(d.max()) for d in diffs if d.numel()), default=0.0)
    bound = SAMPLING_BOUND[contract]
    rollout = {f"tp{tp}": {"version": step, "digest": s["digest"]} for tp, s in syncs.items()}
    return {
        **counts,
        "sampler_vs_trainer_max_abs_diff": worst,
        "bound": bound,
        "within_bound": counts["decode_vs_trainer"] == 0 or (bound > 0 and worst <= bound),
        "trainer_weights": {"version": step, "digest": trainer_digest},
        "rollout_weights": rollout,
        "same_weights": all(r["digest"] == trainer_digest for r in rollout.values()),
    }


def steps_three_way(entries: list[dict]) -> dict:
    """A step's ``three_way``: the worst layout's ``mismatch_count`` and every layout's."""
    per_layout = [{"name": e["name"], **e["three_way"]} for e in entries if "three_way" in e]
    return {
        "bits": "float32",
        "sides": "sampler (decode-time, processed) logprob, prefill re-score, trainer's first "
        "forward of the step",
        "mismatch_count": max((e["mismatch_count"] for e in per_layout), default=0),
        "per_layout": per_layout,
    }


def three_way_failures(step: dict) -> list[str]:
    """A step whose rollout ran on other weights than the trainer scored, or whose sampler
    logprobs are off the trainer's beyond the bound."""
    out = []
    for e in (step.get("three_way") or {}).get("per_layout", []):
        if not e["same_weights"]:
            off = [
                tp
                for tp, r in e["rollout_weights"].items()
                if r["digest"] != e["trainer_weights"]["digest"]
            ]
            out.append(
                f"step {step['step']}: {e['name']}: rollout {', '.join(off)} sampled on other "
                "weights than the trainer scored (weights digests differ)"
            )
        if not e["within_bound"]:
            out.append(
                f"step {step['step']}: {e['name']}: sampler logprobs off the trainer's by "
                f"{e['sampler_vs_trainer_max_abs_diff']:.3g} (bound {e['bound']})"
            )
    return out
