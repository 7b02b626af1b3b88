"""Rules between the policies: runtime policy agreeing with kernel policy, the LoRA section, the
unobservable notes naming real fields."""

from __future__ import annotations

from collections.abc import Iterator

from ..adapters.families import FAMILIES
from .models import (
    LORA_KERNEL_FIELDS,
    Contract,
    When,
)
from .rules_base import Finding


def _flag_on(value: bool | When) -> bool:
    """True when a runtime flag is on for at least one layout."""
    return value.value is True if isinstance(value, When) else bool(value)


def check_policy_consistency(c: Contract) -> Iterator[Finding]:
    kp, rp, ident = c.kernel_policy, c.runtime_policy, c.identity
    tree = kp.all_reduce == "fixed_tree"
    rules: list[tuple[str, bool, str]] = [
        (
            "runtime_policy.megatron.deterministic_row_parallel_reduce",
            rp.megatron.deterministic_row_parallel_reduce == tree,
            f"must be {str(tree).lower()} when kernel_policy.all_reduce is '{kp.all_reduce}'",
        ),
        (
            "runtime_policy.sglang.deterministic_tree_all_reduce",
            _flag_on(rp.sglang.deterministic_tree_all_reduce) == tree,
            f"must be {'on' if tree else 'off'} when kernel_policy.all_reduce is '{kp.all_reduce}'",
        ),
        (
            "runtime_policy.sglang.force_bfloat16_dense_tensor_math",
            _flag_on(rp.sglang.force_bfloat16_dense_tensor_math)
            == (kp.dense_math_dtype == "bfloat16"),
            f"must agree with kernel_policy.dense_math_dtype ('{kp.dense_math_dtype}')",
        ),
        (
            "runtime_policy.sglang.force_bfloat16_lm_head",
            _flag_on(rp.sglang.force_bfloat16_lm_head) == (kp.lm_head_input_dtype == "bfloat16"),
            f"must agree with kernel_policy.lm_head_input_dtype ('{kp.lm_head_input_dtype}')",
        ),
        (
            "runtime_policy.megatron.cast_qk_norm_input_before_weight_mul",
            rp.megatron.cast_qk_norm_input_before_weight_mul == kp.norm_cast_before_weight,
            "must equal kernel_policy.norm_cast_before_weight "
            f"({str(kp.norm_cast_before_weight).lower()})",
        ),
        (
            "runtime_policy.launcher.recompute_logprobs_via_prefill",
            rp.launcher.recompute_logprobs_via_prefill
            == (ident.logprob_contract == "sglang_prefill"),
            "must be true exactly when identity.logprob_contract is 'sglang_prefill' "
            f"(got logprob_contract '{ident.logprob_contract}')",
        ),
        (
            "identity.disable_megatron_sequence_parallel",
            ident.disable_megatron_sequence_parallel != c.parallel.training.sequence_parallel,
            "must be the opposite of parallel.training.sequence_parallel",
        ),
        (
            "runtime_policy.launcher.batch_invariant_mode",
            rp.launcher.batch_invariant_mode or not _flag_on(rp.sglang.tp_invariant_row_linear),
            "must be true when runtime_policy.sglang.tp_invariant_row_linear is on",
        ),
    ]
    for path, ok, message in rules:
        if not ok:
            yield path, message
    cp_sizes = c.parallel.training.cp.sizes
    if max(cp_sizes) > 1 and not isinstance(rp.megatron.cp_layout, When):
        yield (
            "runtime_policy.megatron.cp_layout",
            "must be a layout condition ({when: ulysses_cp, value: ulysses_a2a, otherwise: null}) "
            f"when parallel.training.cp.sizes allows CP > 1 (got {list(cp_sizes)})",
        )


def check_lora(c: Contract) -> Iterator[Finding]:
    """A ``lora`` section comes with every ``kernel_policy.lora_*`` field (and they without it);
    its targets are dense linears of the family; adapters are pre-rounded to the forward dtype."""
    kp, lora = c.kernel_policy, c.lora
    for field in LORA_KERNEL_FIELDS:
        if (getattr(kp, field) is None) == (lora is not None):
            yield (
                f"kernel_policy.{field}",
                "required: the contract has a lora section"
                if lora is not None
                else "must be absent: the contract has no lora section (add one, or drop the "
                "lora_* fields)",
            )
    family = FAMILIES.get(c.family)
    if lora is None or family is None:
        return
    if family.moe is not None:
        yield (
            "lora",
            f"must be absent: LoRA on {family.name}'s experts is not part of any contract yet "
            "(dense families only)",
        )
        return
    known = family.lora_modules()
    seen: set[str] = set()
    for i, name in enumerate(lora.target_modules):
        if name not in known:
            yield (
                f"lora.target_modules.{i}",
                f"{family.name} has no linear {name!r}; known: {', '.join(sorted(known))}",
            )
        if name in seen:
            yield f"lora.target_modules.{i}", f"{name!r} is listed twice"
        seen.add(name)
    if kp.lora_adapter_dtype is not None and kp.lora_adapter_dtype != kp.dense_math_dtype:
        yield (
            "kernel_policy.lora_adapter_dtype",
            f"must equal dense_math_dtype ({kp.dense_math_dtype}): adapters are pre-rounded to "
            f"the forward dtype (got {kp.lora_adapter_dtype})",
        )


def check_unobservable_paths(c: Contract) -> Iterator[Finding]:
    """Every ``unobservable`` key names a real kernel- or runtime-policy field."""
    for path in c.unobservable:
        parts = path.split(".")
        owner = c.kernel_policy if parts[0] == "kernel_policy" else None
        if parts[0] == "runtime_policy":
            owner = getattr(c.runtime_policy, parts[1], None)
        if owner is None or parts[-1] not in type(owner).model_fields:
            known = "kernel_policy.<field> or runtime_policy.<sglang|megatron|launcher>.<field>"
            yield f"unobservable.{path}", f"names no policy field (expected {known})"
