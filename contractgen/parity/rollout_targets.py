"""Rollout targets besides the reference engine (``parity --rollouts``): real vLLM.

The gate's rollouts (every rollout TP) run on the reference engine as before; each further rollout
target named in ``--rollouts`` runs the same workload (same prompts, seeds, sampling params) in
its own engine and is compared bitwise twice: with the reference engine's TP=1 rollout (same
tokens, same decode and prefill logprobs), and with every trainer target at every layout (its
scored logprobs against the trainer's scores of its own sequences), each such pair reported with
``rollout_target`` named. The reference engine's own pairs carry ``rollout_target`` too.

vLLM runs in ``.venv-vllm`` through ``adapters/vllm/client.py`` (a subprocess; one engine per gate
run): the gate's weights go to it as a checkpoint folder (the gate's own ``--checkpoint``, or the
reference model's weights written once as float32 safetensors with transformers' config.json),
its kernel policy is the gate's (``--dtype`` applied), resolved here once.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from ..adapters.common.rollout import RolloutResult, requests_for
from ..adapters.vllm import client
from ..codegen.vendored import load_target
from .harness import GateRun, bits_digest, compare, pair_name, same_tokens, trainer_for
from .reference import hf_model
from .targets import rollout_adapter, rollout_target

REFERENCE = "sglang"
"""The reference engine's name in ``--rollouts`` (the gate's rollout target)."""

ROLLOUT_TARGETS = (REFERENCE, "vllm")

# Scheduler arguments of the gate's vLLM run: at most 64 tokens a step, so the default workload's
# prompts (44..176 tokens) and every re-score are prefilled in chunks across steps.
VLLM_ENGINE = {"max_num_batched_tokens": 64, "max_num_seqs": 16}

# families the vLLM target builds; the others are refused in one line each, with the reason
VLLM_REFUSED = {
    "qwen3_next": "vllm rollout target: Qwen3-Next (hybrid linear attention) is not built in the "
    "vLLM model; gate it with --rollouts sglang",
    "qwen3_moe": "vllm rollout target: Qwen3-MoE is not built in the vLLM model yet (its MoE "
    "block through vLLM-CPU's fused-MoE layer); gate it with --rollouts sglang",
}


class RolloutTargetError(ValueError):
    """An unusable ``--rollouts`` (exit 2, one line)."""


def parse_rollouts(text: str) -> tuple[str, ...]:
    """``--rollouts a,b``: known names, in order, each once."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in ROLLOUT_TARGETS]
    if not names or bad:
        raise RolloutTargetError(
            f"--rollouts {text!r}: unknown rollout target {bad[0] if bad else ''!r}; known: "
            f"{', '.join(ROLLOUT_TARGETS)}"
        )
    return names


def check_rollouts(
    names, family: str, *, lora: bool, train_steps: int, inject_faults: bool
) -> None:
    """Refuse in one line what the vLLM target does not run. (Its run is rollout TP 1: vLLM-CPU's
    multi-process TP is not built; ``--rollout-tps`` above 1 gate the reference engine.)"""
    if "vllm" not in names:
        return
    if family in VLLM_REFUSED:
        raise RolloutTargetError(VLLM_REFUSED[family])
    if lora:
        raise RolloutTargetError(
            "vllm rollout target: LoRA adapters are not built in the vLLM model (vLLM's LoRA "
            "layers run stock kernels); gate LoRA with --rollouts sglang"
        )
    if train_steps:
        raise RolloutTargetError(
            "vllm rollout target: --train-steps with --rollouts vllm is not built yet (weights "
            "in place: adapters/vllm/runner.py push_weights); run the RL loop on the reference"
        )
    # --strict: every vLLM run is checked for vLLM's own ops on the scored path (runner.stock_ops,
    # always on: any fails the gate); the other sides keep their kernel audit
    if inject_faults:
        raise RolloutTargetError(
            "vllm rollout target: --inject-faults is not built for the vLLM run yet (faults are "
            "not planted in it); run --inject-faults without --rollouts vllm"
        )
    if why := client.missing():
        raise RolloutTargetError(f"--rollouts vllm: {why}")


def _checkpoint(config, arch, scratch: Path) -> Path:
    """A folder vLLM reads: the gate's checkpoint, or its state dict written as float32."""
    if isinstance(config.weights, (str, Path)):
        return Path(config.weights)
    profile = load_target(rollout_target()).schema.model_profile_for(config.contract_id)
    out = scratch / "checkpoint"
    hf_model(config.weights, profile, torch.float32).save_pretrained(out)
    return out


def vllm_rollout(run: GateRun, kernel_changes=None) -> tuple[RolloutResult, dict]:
    """The gate's workload in real vLLM; (the result as the reference engine reports one, the
    runner's metadata)."""
    config, reference = run.config, rollout_adapter()
    changes = kernel_changes or {}
    _, kp, _ = reference.policies(config.contract_id, 1, config.dtype_override, changes, {})
    arch, _ = reference.model_arch(config.contract_id, config.weights)
    requests = requests_for(config.workload, arch.vocab_size)
    with tempfile.TemporaryDirectory(prefix="contractgen-vllm-") as tmp:
        ckpt = _checkpoint(config, arch, Path(tmp))
        return client.rollout(ckpt, arch, kp, requests, tmp, engine=VLLM_ENGINE)


def report(run: GateRun) -> dict:
    """``{"rollout_targets": [...], "pairs": [...]}`` for every target of ``--rollouts`` other
    than the reference engine (whose pairs the gate reports already)."""
    names = [n for n in run.config.rollouts if n != REFERENCE]
    entries, pairs = [], []
    first = run.trainer_target
    for name in names:
        t0 = time.perf_counter()
        result, meta = vllm_rollout(run)
        ref = run.rollout(1)
        same = same_tokens(result, ref)
        exact = same and not meta.get("stock_ops")
        worst = 0.0 if same else None
        if same:
            for pick in (lambda r: r.decode_logprobs, lambda r: r.prefill_logprobs):
                cmp = compare(pick(ref), pick(result))
                exact &= cmp.exact
                worst = max(worst, cmp.max_abs_diff)
        entries.append(
            {
                "target": name,
                "vs": f"{REFERENCE} rollout tp1",
                "rollout_tp": 1,
                "tokens_identical": same,
                "exact": exact,
                "max_abs_diff": worst,
                "decode_sha256": bits_digest(result.decode_logprobs),
                "prefill_sha256": bits_digest(result.prefill_logprobs),
                "engine": {"vllm": meta.get("vllm"), **VLLM_ENGINE, "start_s": meta.get("start_s")},
                "contract_op_calls": meta.get("counts"),
                "stock_ops": meta.get("stock_ops"),
                "seconds": round(time.perf_counter() - t0, 2),
            }
        )
        if run.config.progress:
            how = "same tokens" if same else "OTHER TOKENS"
            print(
                f"parity: rollout {name} vs {REFERENCE} tp1: {how}, "
                f"{'exact' if exact else 'logprobs DIFFER'} ({entries[-1]['seconds']} s)",
                flush=True,
                file=sys.stderr,
            )
        for trainer in run.config.trainer_targets:
            run.use_trainer(trainer)
            for layout in run.layouts:
                pc = compare(run.scored_rollout(result), trainer_for(run, layout, result))
                pairs.append(
                    {
                        "name": f"{name} " + pair_name(1, layout, run),
                        "rollout_target": name,
                        "rollout_tp": 1,
                        "trainer": layout.sizes,
                        "target": run.trainer_target,
                        "exact": pc.exact,
                        "max_abs_diff": pc.max_abs_diff,
                        "tokens_compared": pc.tokens_compared,
                    }
                )
                run.release(layout)
        run.use_trainer(first)
    return {"rollout_targets": entries, "pairs": pairs}


def failures(report_: dict) -> list[str]:
    """Why the rollout targets fail the gate (their pairs are in ``pairs``, failed there)."""
    out = []
    for e in report_.get("rollout_targets", []):
        if e.get("stock_ops"):
            out.append(
                f"rollout target {e['target']}: vLLM's own ops on the scored path: "
                + "; ".join(e["stock_ops"][:3])
            )
        elif not e["exact"]:
            why = "other tokens" if not e["tokens_identical"] else "logprobs not exact"
            out.append(
                f"rollout target {e['target']} differs from the {REFERENCE} rollout tp1 ({why})"
            )
    return out


def label_pairs(pairs: list[dict]) -> None:
    """The reference engine's pairs named as such (``rollout_target``)."""
    for p in pairs:
        p.setdefault("rollout_target", REFERENCE)


__all__ = [
    "REFERENCE",
    "ROLLOUT_TARGETS",
    "RolloutTargetError",
    "check_rollouts",
    "failures",
    "label_pairs",
    "parse_rollouts",
    "report",
]
