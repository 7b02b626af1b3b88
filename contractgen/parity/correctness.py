"""What parity cannot prove: agreement with transformers, per layout, and the trainer's gradients.

Both sides of the gate compute with one kernel library, so a bug they share passes bitwise parity.
These checks compare each side with an independent implementation instead: transformers' float32
forward on sequences spanning several KV chunks (``reference.per_layout``), and float64 autograd
through transformers for the gradient of the scored logprobs (``grads.per_layout``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..codegen.targets import by_role
from ..codegen.vendored import load_target
from .compare import bits_digest
from .layouts import Layout
from .reference import (
    hf_grads,
    hf_logprobs,
    hf_model,
    hf_name,
    logprob_tolerance,
    max_abs_diff,
    reference_sequences,
    transformers_reason,
)
from .targets import rollout_target

# max |trainer grad - float64 grad| / max |float64 grad|, per parameter tensor, trainer in
# float32 (--dtype float32 for every kernel dtype). Measured ~1e-6 on the reference model.
GRAD_TOLERANCE = 1e-4


@dataclass
class Reference:
    """transformers' float32 logprobs of the reference sequences."""

    name: str
    sequences: list[list[int]]
    want: list[torch.Tensor]
    tolerance: float
    """max |diff| allowed (``reference.logprob_tolerance`` for the gate's device and family)."""


def _profile(contract_id: str):
    return load_target(rollout_target()).schema.model_profile_for(contract_id)


def reference_for(config: Any) -> tuple[Reference | None, str | None]:
    """(the reference, None) or (None, why there is none). The reference model is transformers'
    own: a checkpoint directory read by transformers, or the contract's reference model built
    from the generated profile (``reference.reference_config``); nothing here goes through the
    adapters' ``ModelArch``, whose mapping from the contract is one of the things compared."""
    if not config.hf_reference:
        return None, "--no-reference given"
    reason = transformers_reason()
    if reason is not None:
        return None, reason
    model = hf_model(config.weights, _profile(config.contract_id), torch.float32)
    seqs = reference_sequences(model.config.vocab_size, model.config.max_position_embeddings)
    tolerance = logprob_tolerance(config.device, family=_profile(config.contract_id).family)
    return Reference(hf_name(config.weights), seqs, hf_logprobs(model, seqs), tolerance), None


def _entry(side: str, name: str, tp: int, pp: int, cp: int, got, ref: Reference) -> dict:
    diff = max_abs_diff(got, ref.want)
    return {
        "side": side,
        "name": name,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "max_abs_diff": diff,
        "tokens_compared": sum(t.numel() for t in ref.want),
        "within_tolerance": diff <= ref.tolerance,
        "bits_sha256": bits_digest(got),
    }


def rollout_reference(run: Any, ref: Reference, tp: int, planted: tuple[str, ...] = ()) -> dict:
    """The rollout at ``tp``, every kernel dtype float32, one prefill per sequence, vs transformers."""
    res = run.rollout(
        tp,
        dtype_override="float32",
        rescore_only=tuple(tuple(s) for s in ref.sequences),
        planted_bugs=run.config.planted_bugs + planted,
    )
    return _entry("rollout", f"rollout tp{tp}", tp, 1, 1, res.prefill_logprobs, ref)


def trainer_reference(
    run: Any, ref: Reference, layout: Layout, planted: tuple[str, ...] = ()
) -> dict:
    """The trainer at ``layout``, every kernel dtype float32, vs transformers."""
    TrainerRun = run.trainer_adapter.TrainerRun

    res = run.trainer_run(
        layout, ref.sequences, TrainerRun(dtype_override="float32", planted_bugs=planted)
    )
    name = run.trainer_label(layout)
    return _entry("trainer", name, layout.tp, layout.pp, layout.cp, res.logprobs, ref)


def reference_report(ref: Reference, per_layout: list[dict]) -> dict:
    """transformers agreement per run, and the float32 runs of both sides against each other:
    they call one kernel library with float32 dtypes, so every rollout TP and trainer layout must
    give the first run's (the TP=1 rollout's) bits. A split there (one side's float32 path on other
    kernels, as the trainer's TF32 attention on CUDA until 2026-12-03) fails as a pair, not only
    as a distance from transformers."""
    first = per_layout[0]
    return {
        "name": ref.name,
        "dtype": "float32",
        "tolerance": ref.tolerance,
        "sequence_lengths": [len(s) for s in ref.sequences],
        "max_abs_diff": max(e["max_abs_diff"] for e in per_layout),
        "within_tolerance": all(e["within_tolerance"] for e in per_layout),
        "float32_bits_identical": all(e["bits_sha256"] == first["bits_sha256"] for e in per_layout),
        "float32_bits_differ_from_first": [
            e["name"] for e in per_layout if e["bits_sha256"] != first["bits_sha256"]
        ],
        "per_layout": per_layout,
    }


@dataclass
class GradReference:
    """float64 autograd gradients (HF names) of the trainer's loss on the gate's sequences."""

    sequences: list[list[int]]
    prompt_lens: list[int]
    grads: dict[str, torch.Tensor]


def grad_reference(run: Any) -> tuple[GradReference | None, str | None]:
    reason = transformers_reason()
    if reason is not None:
        return None, reason
    base = run.rollout(1)
    return grad_reference_of(run.config, base.sequences, base.prompt_lens), None


def grad_reference_of(
    config: Any, sequences: list[list[int]], prompt_lens: list[int]
) -> GradReference:
    """float64 autograd through transformers of the gate's weights on ``sequences`` (the one-shot
    gate's rollout, or an RL step's samples); transformers must import (``transformers_reason``)."""
    model = hf_model(config.weights, _profile(config.contract_id), torch.float64)
    grads = hf_grads(model, sequences, prompt_lens)
    return GradReference(sequences, prompt_lens, grads)


def layout_grads(run: Any, ref: GradReference, layout: Layout) -> dict:
    """The trainer's gradients at ``layout`` (trainer in float32; every TP shard and PP stage,
    gathered under HF names) vs float64 autograd, parameter by parameter."""
    entry: dict[str, Any] = {"name": layout.name, **layout.sizes}
    if layout.ep > 1:
        return {
            **entry,
            "supported": False,
            "note": "not supported: expert parallelism runs the forward only (the EP token "
            "exchange has no backward yet)",
        }
    got = run.trainer_run(layout, ref.sequences, grads_run(ref, run)).hf_grads
    return compare_grads(ref, layout, got)


def grads_run(ref: GradReference, run: Any = None, **changes: Any) -> Any:
    """The ``TrainerRun`` whose ``hf_grads`` ``compare_grads`` takes: float32, ``ref``'s loss
    (of ``run``'s trainer target; default the trainer role's default target)."""
    TrainerRun = (
        run.trainer_adapter if run is not None else by_role("trainer").runtime()
    ).TrainerRun

    return TrainerRun(
        dtype_override="float32", grads=True, prompt_lens=tuple(ref.prompt_lens), **changes
    )


def compare_grads(ref: GradReference, layout: Layout, got: dict[str, torch.Tensor]) -> dict:
    """A layout's gathered HF-named gradients ``got`` vs ``ref``, parameter by parameter."""
    entry: dict[str, Any] = {"name": layout.name, **layout.sizes}
    if set(got) != set(ref.grads):
        raise ValueError(
            f"trainer gradients at {layout.name} cover {sorted(set(got) ^ set(ref.grads))[:4]} "
            "differently from transformers'"
        )
    worst_abs, worst_rel, worst_name = 0.0, 0.0, None
    for name, g in got.items():
        w = ref.grads[name].double()
        d = float((g.double() - w).abs().max())
        rel = d / max(float(w.abs().max()), 1e-30)
        worst_abs = max(worst_abs, d)
        if rel > worst_rel:
            worst_rel, worst_name = rel, name
    return {
        **entry,
        "supported": True,
        "parameters_compared": len(got),
        "max_abs_diff": worst_abs,
        "max_rel_diff": worst_rel,
        "worst_parameter": worst_name,
        "within_tolerance": worst_rel <= GRAD_TOLERANCE,
    }
