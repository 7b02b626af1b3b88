"""``KernelPolicy``: the contract's kernel numerics as one typed, frozen value.

The generated targets carry the same fields in their vendored ``schema.py`` (loaded with ``exec``,
so no annotation can name that class); this one is importable, so every kernel and layer that takes
``kp`` can say what it is. ``KernelPolicy.of`` converts a generated policy (or any object with these
attributes, such as the pydantic model) at the place a side resolves its policy; nothing below that
place converts again. ``tests/kernels/test_kernel_policy_type.py`` holds the fields to the contract
schema's, names and types.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

Dtype = Literal["bfloat16", "float16", "float32"]
"""A torch dtype attribute name (``dtype_of`` turns it into the dtype)."""


@dataclass(frozen=True)
class KernelPolicy:
    """The numerics both engines implement (the contract's ``kernel_policy``; meanings in
    ``schema/models.py``). Optional fields are ``None`` unless the family has that block."""

    dense_math_dtype: Dtype
    matmul_k_block: int
    matmul_accumulation_dtype: Dtype
    matmul_tile_order: Literal["sglang_first_level", "binary", "fixed_runs"]
    all_reduce: Literal["fixed_tree", "nccl"]
    norm_compute_dtype: Dtype
    norm_cast_before_weight: bool
    rope_dtype: Dtype
    attention_kv_chunk: int
    attention_softmax_dtype: Dtype
    residual_dtype: Dtype
    lm_head_input_dtype: Dtype
    logsoftmax_dtype: Dtype
    logsoftmax_vocab_block: int
    matmul_k_runs: int | None = None
    matmul_column_k_runs: int | None = None
    # mixture of experts
    moe_router_logits_dtype: Dtype | None = None
    moe_router_softmax_dtype: Dtype | None = None
    moe_topk_tie_break: Literal["lowest_expert_id", "highest_expert_id"] | None = None
    moe_topk_normalisation: Literal["divide_by_topk_sum", "softmax_over_topk_logits"] | None = None
    moe_token_order: Literal["token_index", "unordered"] | None = None
    moe_combine_order: Literal["expert_id", "topk_rank"] | None = None
    moe_ep_combine: Literal["gather_slots", "sum_partials"] | None = None
    moe_combine_dtype: Dtype | None = None
    # hybrid linear attention (Gated DeltaNet) and its neighbours
    delta_rule_chunk: int | None = None
    delta_rule_chunk_dtype: Dtype | None = None
    delta_rule_state_dtype: Dtype | None = None
    delta_rule_solve: Literal["row_substitution", "lapack"] | None = None
    conv_dtype: Dtype | None = None
    gate_dtype: Dtype | None = None
    shared_expert_combine: Literal["after_routed", "first_in_fold"] | None = None
    # LoRA (unmerged adapters)
    lora_adapter_dtype: Dtype | None = None
    lora_low_rank_dtype: Dtype | None = None
    lora_matmul: Literal["invariant", "stock"] | None = None
    lora_scale_at: Literal["delta_output", "low_rank_output"] | None = None
    lora_scale_dtype: Dtype | None = None
    lora_add_dtype: Dtype | None = None
    lora_serving: Literal["unmerged"] | None = None

    @classmethod
    def of(cls, policy: Any) -> KernelPolicy:
        """This type from a generated ``KernelPolicy`` (or the pydantic model, or anything with
        these attributes); a ``KernelPolicy`` comes back as it is. A missing attribute raises
        ``AttributeError`` naming it: the source is older than this type."""
        if isinstance(policy, cls):
            return policy
        return cls(**{f.name: getattr(policy, f.name) for f in dataclasses.fields(cls)})
