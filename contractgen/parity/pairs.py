"""Every (rollout TP, trainer layout) pair compared bitwise, every rollout TP against the TP=1
reference, and where a mismatch first appears (``first_divergence``: layer by layer)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from ..adapters.common.rollout import RolloutResult
from ..codegen.vendored import load_target
from .compare import bits_digest, compare
from .correctness import layout_grads, trainer_reference
from .gate_run import GateRun, _say
from .layouts import Layout
from .targets import rollout_target


def first_divergence(
    run: GateRun,
    layout: Layout,
    first: tuple[int, int],
    *,
    trainer_fault=None,
    rollout_changes: dict | None = None,
) -> dict:
    """Name the first layer whose output differs between the two sides, for one sequence.

    Both sides are re-run with per-layer dumps under the same faults as the compared runs.
    """
    seq_i, tok = first
    changes = rollout_changes or {}
    base = run.rollout(layout.tp, **changes)
    dumped = run.rollout(layout.tp, dump_layers=True, **changes)
    _, trainer_dumps = run.trainer(layout, fault=trainer_fault, dump_layers=True, rollout=base)
    rollout_layers = dumped.layer_dumps[seq_i] if dumped.layer_dumps else []
    trainer_layers = trainer_dumps[seq_i] if trainer_dumps else {}
    for i, r in enumerate(rollout_layers):
        t = trainer_layers.get(f"layer.{i}")
        if t is None:
            continue
        t = t[: r.shape[0]]
        if r.shape != t.shape or r.dtype != t.dtype or not torch.equal(r, t):
            rows = ((r.double() - t.double()).abs().sum(-1) != 0).nonzero()
            row = int(rows[0, 0]) if rows.numel() else 0
            col = (
                int(((r[row].double() - t[row].double()) != 0).nonzero()[0, 0])
                if rows.numel()
                else 0
            )
            return {
                "layer": i,
                "module": f"decoder.layers.{i}",
                "token_index": row,
                "rollout": float(r[row, col]),
                "trainer": float(t[row, col]),
            }
    scored_r = run.scored_rollout(base)[seq_i]
    scored_t = run.trainer(layout, fault=trainer_fault, rollout=base)[0][seq_i]
    return {
        "layer": None,
        "module": "final_norm/lm_head/log_softmax",
        "token_index": base.prompt_lens[seq_i] - 1 + tok,
        "rollout": float(scored_r[tok]),
        "trainer": float(scored_t[tok]),
    }


def pair_name(rollout_tp: int, layout: Layout, run: GateRun | None = None) -> str:
    trainer = run.trainer_label(layout) if run is not None else f"trainer {layout.trainer_label}"
    return f"rollout tp{rollout_tp} \u00d7 {trainer}"


def same_tokens(a: RolloutResult, b: RolloutResult) -> bool:
    return a.sequences == b.sequences


def trainer_for(run: GateRun, layout: Layout, rollout: RolloutResult) -> list[torch.Tensor]:
    """The trainer's scored logprobs at ``layout`` on ``rollout``'s sequences (the cached run on
    the reference sequences when they are the same tokens)."""
    if same_tokens(rollout, run.rollout(1)):
        return run.trainer(layout)[0]
    return run.trainer(layout, rollout=rollout)[0]


def run_rollouts(run: GateRun) -> dict:
    """Every rollout TP against the TP=1 reference: same token ids (greedy and seeded sampling
    alike), and bitwise the same decode and prefill logprobs."""
    ref = run.rollout(1)
    per_tp = []
    for tp in run.config.rollout_tps:
        t0 = time.perf_counter()
        res = run.rollout(tp)
        same = same_tokens(res, ref)
        entry = {"tp": tp, "tokens_identical": same, "logprobs_exact": same, "max_abs_diff": 0.0}
        if same:
            for pick in (lambda r: r.decode_logprobs, lambda r: r.prefill_logprobs):
                cmp = compare(pick(ref), pick(res))
                entry["logprobs_exact"] &= cmp.exact
                entry["max_abs_diff"] = max(entry["max_abs_diff"], cmp.max_abs_diff)
        else:
            entry["max_abs_diff"] = None
        entry["decode_sha256"] = bits_digest(res.decode_logprobs)
        entry["prefill_sha256"] = bits_digest(res.prefill_logprobs)
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        if run.config.progress:
            how = "same tokens" if same else "OTHER TOKENS"
            exact = "exact" if entry["logprobs_exact"] else "logprobs DIFFER"
            _say(f"rollout tp{tp} vs tp1: {how}, {exact} ({entry['seconds']} s)")
        per_tp.append(entry)
    return {
        "rollout_tokens_identical": all(e["tokens_identical"] for e in per_tp),
        "rollouts": per_tp,
    }


def run_layouts(run: GateRun, ref=None, grad_ref=None) -> dict:
    """Per trainer layout: the rollout at that layout's TP vs the trainer (``layouts``, with the
    first divergence); every (rollout TP, trainer layout) pair (``pairs``); with ``ref``, the
    trainer in float32 vs transformers (``reference``); with ``grad_ref``, gradients vs float64
    (``grads``). A layout's trainer processes are released before the next layout starts."""

    out, pairs, reference, grads = [], [], [], []
    for layout in run.layouts:
        t0 = time.perf_counter()
        if run.config.progress:
            ep = "".join(f" {k}={v}" for k, v in (("DP", layout.dp), ("EP", layout.ep)) if v > 1)
            _say(
                f"layout {run.layout_key(layout)}: trainer TP={layout.tp} PP={layout.pp} CP={layout.cp}{ep}"
            )
        own = run.rollout(layout.tp)
        scored = trainer_for(run, layout, own)
        cmp = compare(run.scored_rollout(own), scored)
        entry = {
            "name": run.layout_key(layout),
            "target": run.trainer_target,
            **layout.sizes,
            "exact": cmp.exact,
            "tokens_compared": cmp.tokens_compared,
            "max_abs_diff": cmp.max_abs_diff,
            "logprobs_sha256": bits_digest(scored),
            "first_divergence": (
                None if cmp.first is None else first_divergence(run, layout, cmp.first)
            ),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        for tp in run.config.rollout_tps:
            r = run.rollout(tp)
            pc = compare(run.scored_rollout(r), trainer_for(run, layout, r))
            pairs.append(
                {
                    "name": pair_name(tp, layout, run),
                    "rollout_tp": tp,
                    "trainer": layout.sizes,
                    "target": run.trainer_target,
                    "exact": pc.exact,
                    "max_abs_diff": pc.max_abs_diff,
                    "tokens_compared": pc.tokens_compared,
                }
            )
        if run.config.progress:
            bad = [p["name"] for p in pairs[-len(run.config.rollout_tps) :] if not p["exact"]]
            _say(
                f"layout {layout.name}: {'exact' if cmp.exact else 'DIFFERS'} over "
                f"{cmp.tokens_compared} tokens; pairs with rollout tp{run.config.rollout_tps}: "
                f"{'all exact' if not bad else 'DIFFER: ' + ', '.join(bad)} ({entry['seconds']} s)"
            )
        out.append(entry)
        if ref is not None:
            reference.append(trainer_reference(run, ref, layout))
            if run.config.progress:
                _say(
                    f"layout {run.layout_key(layout)}: vs transformers {reference[-1]['max_abs_diff']:.3g}"
                )
        if grad_ref is not None:
            grads.append(layout_grads(run, grad_ref, layout))
            if run.config.progress:
                g = grads[-1]
                how = f"max rel {g['max_rel_diff']:.3g}" if g["supported"] else "not supported"
                _say(f"layout {run.layout_key(layout)}: gradients vs float64: {how}")
        run.release(layout)
    return {"layouts": out, "pairs": pairs, "reference": reference, "grads": grads}


def _policies_at(run: GateRun, layout: Layout, rollout_tp: int | None = None):
    """(kernel, rollout runtime, trainer runtime) policies in force at ``layout`` (the rollout
    at ``rollout_tp``, default the layout's TP)."""

    cid = run.config.contract_id
    trainer = load_target(run.trainer_target)
    kp = trainer.schema.kernel_policy_for(cid)
    sg = load_target(rollout_target()).runtime_policy.policy_for(
        cid, SimpleNamespace(tp_size=layout.tp if rollout_tp is None else rollout_tp)
    )
    mg = trainer.runtime_policy.policy_for(
        cid,
        SimpleNamespace(
            tensor_model_parallel_size=layout.tp,
            context_parallel_size=layout.cp,
            cp_comm_type="a2a",
            batch_invariant_mode=True,
        ),
    )
    return kp, sg, mg
