"""Rules of the model family and its blocks: family, MoE, hybrid linear attention, tied router
experts."""

from __future__ import annotations

from collections.abc import Iterator

from ..adapters.families import FAMILIES
from .models import (
    HYBRID_DIMS_FIELDS,
    HYBRID_KERNEL_FIELDS,
    MOE_DIMS_FIELDS,
    MOE_KERNEL_FIELDS,
    Contract,
)
from .rules_base import Finding, _dims_entries


def check_family(c: Contract) -> Iterator[Finding]:
    """The family is a known one, and the profile states what that family is."""
    family = FAMILIES.get(c.family)
    if family is None:
        yield (
            "family",
            f"unknown model family {c.family!r}; known: {', '.join(FAMILIES)} "
            "(a family is one module in adapters/families/)",
        )
        return
    mp = c.model_profile
    if mp.architectures.hf not in family.hf_architectures:
        yield (
            "model_profile.architectures.hf",
            f"{family.name} models are {', '.join(family.hf_architectures)} "
            f"(got {mp.architectures.hf})",
        )
    if mp.qk_norm != family.qk_norm:
        yield (
            "model_profile.qk_norm",
            f"must be {str(family.qk_norm).lower()}: {family.name} "
            f"{'has' if family.qk_norm else 'has no'} QK-norm",
        )
    if mp.attention_bias and not family.attention_bias:
        yield "model_profile.attention_bias", f"must be false: {family.name} has no attention bias"
    if not family.tied_head:
        for path, d in _dims_entries(c):
            if d.tie_word_embeddings:
                yield f"{path}.tie_word_embeddings", f"{family.name} has no tied LM head"


def check_moe(c: Contract) -> Iterator[Finding]:
    """MoE dims and MoE kernel policy are set exactly when the family has an MoE block, and the
    routing dims make sense (top-k within the experts, dense layers within the model)."""
    family = FAMILIES.get(c.family)
    if family is None:
        return
    has_moe = family.moe is not None
    kp = c.kernel_policy
    if not has_moe and c.parallel.training.ep not in (None, (1,)):
        yield (
            "parallel.training.ep",
            f"must be absent: {family.name} has no mixture-of-experts block to split over ranks",
        )
    for field in MOE_KERNEL_FIELDS:
        if (getattr(kp, field) is None) == has_moe:
            yield (
                f"kernel_policy.{field}",
                f"required: {family.name} has a mixture-of-experts block"
                if has_moe
                else f"must be absent: {family.name} has no mixture-of-experts block",
            )
    for path, d in _dims_entries(c):
        missing = [f for f in MOE_DIMS_FIELDS if (getattr(d, f) is None) == has_moe]
        for field in missing:
            yield (
                f"{path}.{field}",
                f"required: {family.name} has a mixture-of-experts block"
                if has_moe
                else f"must be absent: {family.name} has no mixture-of-experts block",
            )
        if not has_moe or missing:
            continue
        ep = c.parallel.training.ep or (1,)
        uneven = [n for n in ep if d.num_experts % n]
        if path == "model_profile.reference_model" and uneven:
            yield (
                "parallel.training.ep",
                f"sizes {uneven} do not divide the reference model's num_experts "
                f"{d.num_experts} (each EP rank holds the same number of whole experts)",
            )
        if d.num_experts_per_tok > d.num_experts:
            yield (
                f"{path}.num_experts_per_tok",
                f"must not exceed num_experts (got {d.num_experts_per_tok} of {d.num_experts})",
            )
        outside = [i for i in d.mlp_only_layers if i >= d.num_layers]
        if outside:
            yield (
                f"{path}.mlp_only_layers",
                f"layers {outside} do not exist (num_layers is {d.num_layers})",
            )


def check_hybrid(c: Contract) -> Iterator[Finding]:
    """Linear-attention dims and kernel fields are set exactly when the family has a
    linear-attention block; the norm kind is the family's; grouped value heads divide; context
    parallelism is refused (a linear-attention layer's state runs through every token in order,
    and no state hand-off between CP ranks is built)."""
    family = FAMILIES.get(c.family)
    if family is None:
        return
    hybrid = family.hybrid is not None
    what = f"{family.name} {'has' if hybrid else 'has no'} linear-attention layers"
    for field in HYBRID_KERNEL_FIELDS:
        if (getattr(c.kernel_policy, field) is None) == hybrid:
            yield f"kernel_policy.{field}", ("required: " if hybrid else "must be absent: ") + what
    kind = "zero_centred_rmsnorm" if family.zero_centred_norm else "rmsnorm"
    if c.model_profile.norm.kind != kind:
        yield "model_profile.norm.kind", f"must be {kind} for {family.name}"
    for path, d in _dims_entries(c):
        missing = [f for f in HYBRID_DIMS_FIELDS if (getattr(d, f) is None) == hybrid]
        for field in missing:
            yield f"{path}.{field}", ("required: " if hybrid else "must be absent: ") + what
        if not hybrid or missing:
            continue
        if d.linear_num_value_heads % d.linear_num_key_heads:
            yield (
                f"{path}.linear_num_value_heads",
                f"must be a multiple of linear_num_key_heads (got {d.linear_num_value_heads} "
                f"for {d.linear_num_key_heads})",
            )
        for tp in d.tp_sizes or c.parallel.training.tp:
            if d.linear_num_key_heads % tp:
                yield (
                    f"{path}.linear_num_key_heads",
                    f"TP={tp} must divide linear_num_key_heads (got {d.linear_num_key_heads}: "
                    "TP splits whole key-head groups); list the TP sizes it supports in tp_sizes",
                )
                break
    if hybrid and any(n > 1 for n in c.parallel.training.cp.sizes):
        yield (
            "parallel.training.cp.sizes",
            f"must be [1]: context parallelism over {family.name}'s linear-attention layers is "
            "not built (their recurrent state would have to pass between CP ranks)",
        )


def check_tied_router_experts(c: Contract) -> Iterator[Finding]:
    """Router ties are a property of the seeded reference model (a real checkpoint's router
    weights are its own), need an MoE block, and name two or more existing experts."""
    for i, d in enumerate(c.model_profile.checkpoints):
        if d.tied_router_experts is not None:
            yield (
                f"model_profile.checkpoints.{i}.tied_router_experts",
                "must be absent: a checkpoint's router weights are its own; only "
                "model_profile.reference_model (seeded random weights) can tie router rows",
            )
    d = c.model_profile.reference_model
    tied, path = d.tied_router_experts, "model_profile.reference_model.tied_router_experts"
    if tied is None:
        return
    if d.num_experts is None:
        yield path, "must be absent: the reference model has no mixture-of-experts block"
        return
    if len(tied) < 2 or list(tied) != sorted(set(tied)):
        yield (
            path,
            f"must list two or more expert ids, ascending, without repeats (got {list(tied)})",
        )
    outside = [e for e in tied if e >= d.num_experts]
    if outside:
        yield path, f"experts {outside} do not exist (num_experts is {d.num_experts})"
