"""Rules that relate one part of a contract to another.

Each rule returns ``(field path, message)`` pairs; the loader turns paths into ``file:line:col``.
These are the checks JSON Schema cannot express (divisibility, tile-tree alignment, consistency of
runtime policy with kernel policy), so a file can satisfy ``contract.schema.json`` and still fail
here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ..adapters.families import FAMILIES, Family
from ..adapters.tile_order import split_problem
from .models import (
    HYBRID_DIMS_FIELDS,
    HYBRID_KERNEL_FIELDS,
    LORA_KERNEL_FIELDS,
    MOE_DIMS_FIELDS,
    MOE_KERNEL_FIELDS,
    Contract,
    ModelDims,
    When,
)

Finding = tuple[str, str]


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _nearest(allowed: list[int], n: int) -> str:
    good = sorted(allowed, key=lambda a: (abs(a - n), a))[:2]
    return ", ".join(str(g) for g in sorted(good)) if good else "none"


def _dims_entries(c: Contract) -> Iterator[tuple[str, ModelDims]]:
    for i, dims in enumerate(c.model_profile.checkpoints):
        yield f"model_profile.checkpoints.{i}", dims
    yield "model_profile.reference_model", c.model_profile.reference_model


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


def _family(c: Contract) -> Family | None:
    return FAMILIES.get(c.family)


def check_unique_sizes(c: Contract) -> Iterator[Finding]:
    lists = {
        "parallel.training.tp": c.parallel.training.tp,
        "parallel.training.pp": c.parallel.training.pp,
        "parallel.training.cp.sizes": c.parallel.training.cp.sizes,
        "parallel.rollout.tp": c.parallel.rollout.tp,
    }
    for path, sizes in lists.items():
        if len(set(sizes)) != len(sizes) or list(sizes) != sorted(sizes):
            yield path, f"must be sorted and free of repeats (got {list(sizes)})"
        if 1 not in sizes:
            yield path, f"must include 1 (got {list(sizes)})"


def check_tree_needs_power_of_two(c: Contract) -> Iterator[Finding]:
    if c.kernel_policy.all_reduce != "fixed_tree":
        return
    for path, sizes in (
        ("parallel.training.tp", c.parallel.training.tp),
        ("parallel.rollout.tp", c.parallel.rollout.tp),
    ):
        for i, tp in enumerate(sizes):
            if not _is_power_of_two(tp):
                yield (
                    f"{path}.{i}",
                    f"TP={tp} is not a power of two; the fixed-tree all-reduce needs one "
                    f"(nearest allowed: {_nearest([1, 2, 4, 8, 16, 32, 64], tp)})",
                )


def _tp_sizes_for(c: Contract, dims: ModelDims) -> list[int]:
    sizes = set(c.parallel.training.tp) | set(c.parallel.rollout.tp)
    if dims.tp_sizes is not None:
        sizes &= set(dims.tp_sizes)
    return sorted(sizes)


def check_dims(c: Contract) -> Iterator[Finding]:
    """Each checkpoint's dims split evenly, and into whole tile subtrees, at every allowed TP."""
    kp = c.kernel_policy
    tree = kp.all_reduce == "fixed_tree"
    family = _family(c)
    # run counts that are not powers of two are check_fixed_runs' finding, once, not per K
    runs_ok = all(
        r is None or _is_power_of_two(r) for r in (kp.matmul_k_runs, kp.matmul_column_k_runs)
    )
    for path, d in _dims_entries(c):
        if d.num_attention_heads % d.num_kv_heads:
            yield (
                f"{path}.num_kv_heads",
                f"must divide num_attention_heads (got {d.num_kv_heads} for {d.num_attention_heads})",
            )
            continue
        if d.tp_sizes is not None:
            extra = sorted(
                set(d.tp_sizes) - set(c.parallel.training.tp) - set(c.parallel.rollout.tp)
            )
            if extra:
                yield (
                    f"{path}.tp_sizes",
                    f"lists TP sizes the contract does not allow: {extra} "
                    f"(allowed: {sorted(set(c.parallel.training.tp) | set(c.parallel.rollout.tp))})",
                )
        moe_ok = (
            family is None
            or family.moe is None
            or all(getattr(d, f) is not None for f in MOE_DIMS_FIELDS)
        )
        if kp.matmul_tile_order == "fixed_runs" and family is not None and moe_ok and runs_ok:
            # every matmul, column-parallel and LM head too, runs K in whole runs at TP=1 already
            # (a row-parallel K in matmul_k_runs, any other in matmul_column_k_runs if set)
            unfit = {}
            rows = {role for role, _, _ in family.row_parallel(d)}
            for role, field, k in family.matmul_ks(d):
                runs = kp.matmul_k_runs if role in rows else column_runs(kp)
                why = split_problem(k, kp.matmul_k_block, 1, "fixed_runs", runs)
                if why:
                    unfit.setdefault(field, f"{role}: {why}")
            for field, why in unfit.items():
                yield (
                    f"{path}.{field}",
                    f"{why}, at every TP; under fixed_runs no tp_sizes helps: gate this "
                    "checkpoint under a contract with a per-tile matmul order",
                )
            if unfit:
                continue
        found: dict[str, str] = {}  # one finding per field: the smallest TP that fails
        for tp in _tp_sizes_for(c, d):
            if tp == 1 or (tree and not _is_power_of_two(tp)):
                continue  # TP=1 splits every K but fixed_runs' (above); non-powers of two: own rule
            checks = [
                ("num_attention_heads", d.num_attention_heads % tp != 0,
                 f"TP={tp} must divide num_attention_heads (got {d.num_attention_heads})"),
                ("num_kv_heads",
                 d.num_kv_heads % tp != 0 and (c.parallel.kv_heads == "divide" or tp % d.num_kv_heads != 0),
                 f"TP={tp} must divide num_kv_heads (got {d.num_kv_heads}); or set "
                 "parallel.kv_heads: replicate when TP is a multiple of it"),
                ("intermediate_size", d.intermediate_size % tp != 0,
                 f"TP={tp} must divide intermediate_size (got {d.intermediate_size})"),
            ]  # fmt: skip
            for field, bad, message in checks:
                if bad:
                    found.setdefault(field, message)
            row_parallel = family.row_parallel(d) if family is not None and moe_ok else ()
            for _, field, k in row_parallel:
                why = split_problem(
                    k, kp.matmul_k_block, tp, kp.matmul_tile_order, kp.matmul_k_runs
                )
                if why:
                    found.setdefault(field, why)
        hint = "list the TP sizes this checkpoint supports in tp_sizes"
        for field, message in found.items():
            yield f"{path}.{field}", f"{message}; {hint}"


def column_runs(kp: Any) -> int | None:
    """The run count of a matmul whose K no TP layout splits: ``matmul_column_k_runs`` if set,
    else ``matmul_k_runs`` (as the kernels' ``matmul.k_runs``)."""
    return kp.matmul_column_k_runs or kp.matmul_k_runs


def check_fixed_runs(c: Contract) -> Iterator[Finding]:
    """``matmul_k_runs`` is set exactly under ``fixed_runs``, which accumulates in float32 and
    needs every allowed TP size to divide the run count (per-checkpoint K is ``check_dims``');
    ``matmul_column_k_runs`` only with it, a power of two, and (for now) only where every
    matmul is a dense layer's or the LM head's."""
    kp = c.kernel_policy
    path = "kernel_policy.matmul_k_runs"
    if kp.matmul_tile_order != "fixed_runs":
        for field in ("matmul_k_runs", "matmul_column_k_runs"):
            if getattr(kp, field) is not None:
                yield (
                    f"kernel_policy.{field}",
                    (
                        "is only read by matmul_tile_order 'fixed_runs' "
                        f"(got '{kp.matmul_tile_order}'); remove it"
                    ),
                )
        return
    yield from _column_runs_problems(c)
    runs = kp.matmul_k_runs
    if runs is None:
        yield path, "is required when matmul_tile_order is 'fixed_runs' (a power of two, e.g. 8)"
        return
    if not _is_power_of_two(runs):
        yield (
            path,
            (
                f"must be a power of two (got {runs}; nearest: "
                f"{_nearest([1, 2, 4, 8, 16, 32, 64], runs)})"
            ),
        )
        return
    if kp.matmul_accumulation_dtype != "float32":
        yield (
            "kernel_policy.matmul_accumulation_dtype",
            (
                "must be float32 under matmul_tile_order 'fixed_runs' (a run is one float32 dot; "
                f"got {kp.matmul_accumulation_dtype})"
            ),
        )
    for where, sizes in (
        ("parallel.training.tp", c.parallel.training.tp),
        ("parallel.rollout.tp", c.parallel.rollout.tp),
    ):
        bad = [tp for tp in sizes if runs % tp]
        if bad:
            yield (
                where,
                (
                    f"TP={bad[0]} does not divide kernel_policy.matmul_k_runs={runs} (a row-parallel "
                    f"rank holds matmul_k_runs / TP whole runs); allowed: "
                    f"{[t for t in sizes if runs % t == 0]}"
                ),
            )


def _column_runs_problems(c: Contract) -> Iterator[Finding]:
    kp = c.kernel_policy
    runs = kp.matmul_column_k_runs
    if runs is None:
        return
    path = "kernel_policy.matmul_column_k_runs"
    if not _is_power_of_two(runs):
        yield (
            path,
            f"must be a power of two (got {runs}; nearest: {_nearest([1, 2, 4, 8, 16, 32, 64], runs)})",
        )
    family = _family(c)
    if family is not None and (family.moe is not None or family.hybrid is not None):
        yield (
            path,
            (
                f"is not supported for family '{c.family}' yet: its expert and linear-attention "
                "matmuls are not classified as row- or column-parallel for every layout "
                "(remove it; matmul_k_runs then applies to every matmul)"
            ),
        )


def check_vocab_block(c: Contract) -> Iterator[Finding]:
    """A vocab that is not whole blocks per rank is padded; only a trimming trainer may allow it."""
    if c.runtime_policy.megatron.apply_logits_contract:
        return
    block = c.kernel_policy.logsoftmax_vocab_block
    for path, d in _dims_entries(c):
        bad = [tp for tp in _tp_sizes_for(c, d) if d.vocab_size % (block * tp)]
        if bad:
            yield (
                f"{path}.vocab_size",
                f"vocab {d.vocab_size} is not a whole number of {block}-wide blocks per rank at "
                f"TP={bad[0]}; set runtime_policy.megatron.apply_logits_contract: true so the "
                "padded vocabulary is trimmed before log-softmax",
            )


def check_layers_vs_pp(c: Contract) -> Iterator[Finding]:
    allowed = c.parallel.training.pp
    for path, d in _dims_entries(c):
        if d.pp_sizes is not None:
            extra = sorted(set(d.pp_sizes) - set(allowed))
            if extra:
                yield (
                    f"{path}.pp_sizes",
                    f"lists PP sizes the contract does not allow: {extra} (allowed: {list(allowed)})",
                )
        for pp in allowed if d.pp_sizes is None else sorted(set(allowed) & set(d.pp_sizes)):
            if d.num_layers % pp:
                yield (
                    f"{path}.num_layers",
                    f"PP={pp} must divide num_layers (got {d.num_layers}); "
                    f"allowed PP sizes that divide it: "
                    f"{[p for p in range(1, d.num_layers + 1) if d.num_layers % p == 0][:6]}; "
                    "or list the PP sizes this checkpoint supports in pp_sizes",
                )


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


RULES: tuple[Callable[[Contract], Iterator[Finding]], ...] = (
    check_family,
    check_moe,
    check_hybrid,
    check_tied_router_experts,
    check_unique_sizes,
    check_tree_needs_power_of_two,
    check_dims,
    check_fixed_runs,
    check_vocab_block,
    check_layers_vs_pp,
    check_policy_consistency,
    check_lora,
    check_unobservable_paths,
)


def check_contract(c: Contract) -> list[Finding]:
    """Every cross-field finding for one contract, in rule order."""
    out: list[Finding] = []
    for rule in RULES:
        out.extend(rule(c))
    return out
