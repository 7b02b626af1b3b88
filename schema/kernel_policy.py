"""The kernel policy: the numerics both engines implement, field by field."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from .base import (
    Dtype,
    PositiveInt,
    _Model,
)

# ---------------------------------------------------------------------------------------------
# Kernel policy: the numerics both engines implement.


class KernelPolicy(_Model):
    dense_math_dtype: Dtype = Field(
        description="dtype of weights and activations in every dense matmul (QKV, O, gate/up, down)."
    )
    matmul_k_block: PositiveInt = Field(description="Width of a K tile in the invariant matmul.")
    matmul_accumulation_dtype: Dtype = Field(
        description="dtype tile partials are produced in and summed in."
    )
    matmul_tile_order: Literal["sglang_first_level", "binary", "fixed_runs"] = Field(
        description=(
            "'sglang_first_level': runs of first_level_block(T) tiles summed in sequence, then a "
            "binary tree over the runs (SGLang's TP-invariant row linear); 'binary': a plain "
            "binary tree over all tiles; 'fixed_runs': K cut into matmul_k_runs equal runs, each "
            "one dot product accumulated in float32 over its k_block-wide tiles (no rounding "
            "inside a run), the runs summed by a binary tree in float32 that the TP all-reduce "
            "continues (a row-parallel rank holds matmul_k_runs / TP whole runs), rounded once."
        )
    )
    all_reduce: Literal["fixed_tree", "nccl"] = Field(
        description=(
            "'fixed_tree': gather the rank partials and sum adjacent pairs level by level, "
            "identical on every rank; 'nccl': torch.distributed.all_reduce (order chosen by NCCL)."
        )
    )
    norm_compute_dtype: Dtype = Field(description="dtype RMSNorm statistics are computed in.")
    norm_cast_before_weight: bool = Field(
        description="Round the normalised input to its dtype before multiplying by the weight."
    )
    rope_dtype: Dtype = Field(description="dtype of cos/sin and of the rotation.")
    attention_kv_chunk: PositiveInt = Field(
        description="KV positions per online-softmax chunk; chunks start at absolute position 0."
    )
    attention_softmax_dtype: Dtype = Field(
        description="dtype of scores, running max/sum and the output accumulator."
    )
    residual_dtype: Dtype = Field(description="dtype the residual stream is carried and added in.")
    lm_head_input_dtype: Dtype = Field(
        description="dtype of the final hidden state and LM-head weight in the logits matmul."
    )
    logsoftmax_dtype: Dtype = Field(
        description="dtype logits are cast to before log-softmax, and of the returned logprobs."
    )
    logsoftmax_vocab_block: PositiveInt = Field(
        description="Vocab chunk of the fixed-order max / sum-exp reduction."
    )
    # The fixed_runs order's run count: set exactly under that order.
    matmul_k_runs: PositiveInt | None = Field(
        default=None,
        description=(
            "'fixed_runs' only: the number of equal K runs of the full (unsplit) reduction, a "
            "power of two that every allowed TP size divides; absent for the other orders. With "
            "matmul_column_k_runs set, it counts the runs of a row-parallel linear's K only."
        ),
    )
    matmul_column_k_runs: PositiveInt | None = Field(
        default=None,
        description=(
            "'fixed_runs' only: the run count of every matmul whose K no TP layout splits "
            "(column-parallel projections, the LM head), a power of two; 1 is one float32 dot "
            "over all of K. Absent: matmul_k_runs, as for a row-parallel linear. Such a K is "
            "never shared between ranks, so it needs no tree for TP; fewer runs keep fewer "
            "float32 partials live per output element, which lets the kernel take a larger tile."
        ),
    )
    # Mixture of experts: set exactly when the contract's family has an MoE block (absent from a
    # dense contract's canonical data, so dense fingerprints do not move).
    moe_router_logits_dtype: Dtype | None = Field(
        default=None,
        description=(
            "dtype of the router matmul's operands, tile partials and logits (the "
            "batch-invariant matmul, router weight replicated on every TP rank)."
        ),
    )
    moe_router_softmax_dtype: Dtype | None = Field(
        default=None,
        description=(
            "dtype of the softmax over all experts' logits (fixed-order sum) and of the top-k "
            "weights and their normalisation."
        ),
    )
    moe_topk_tie_break: Literal["lowest_expert_id", "highest_expert_id"] | None = Field(
        default=None,
        description=(
            "Which expert wins among equal routing probabilities: a stable sort by probability, "
            "ties by ascending ('lowest_expert_id') or descending expert id."
        ),
    )
    moe_topk_normalisation: Literal["divide_by_topk_sum", "softmax_over_topk_logits"] | None = (
        Field(
            default=None,
            description=(
                "How the top-k weights are renormalised when the checkpoint's norm_topk_prob is "
                "true: 'divide_by_topk_sum' (softmax over all experts, the selected probabilities "
                "divided by their fixed-order sum: HF, SGLang) or 'softmax_over_topk_logits' (a "
                "softmax over the k selected logits: Megatron's router without pre-softmax)."
            ),
        )
    )
    moe_token_order: Literal["token_index", "unordered"] | None = Field(
        default=None,
        description=(
            "Order of the tokens grouped to one expert: ascending token index in the batch "
            "('token_index'), or any order ('unordered', as an atomics-based align kernel gives)."
        ),
    )
    moe_combine_order: Literal["expert_id", "topk_rank"] | None = Field(
        default=None,
        description=(
            "Order a token's k weighted expert outputs are summed in (a left fold): ascending "
            "expert id (HF's expert loop) or top-k rank (highest weight first)."
        ),
    )
    moe_ep_combine: Literal["gather_slots", "sum_partials"] | None = Field(
        default=None,
        description=(
            "How expert-parallel ranks return a token's expert outputs (EP > 1): "
            "'gather_slots' moves each (token, slot) output from its expert's rank and the "
            "token's rank combines all k in moe_combine_order, as at EP 1; 'sum_partials' has "
            "each rank combine its own experts' slots and sums the partial combines over ranks "
            "(a reduce-scatter of partial sums, as Megatron's dispatchers and SGLang's EP MoE do)."
        ),
    )
    moe_combine_dtype: Dtype | None = Field(
        default=None,
        description=(
            "dtype each expert output (reduced over TP, in dense_math_dtype) is weighted and "
            "summed in; the sum is rounded once to dense_math_dtype."
        ),
    )

    # Hybrid linear attention (Gated DeltaNet) and its neighbours: set exactly when the family
    # has a linear-attention block (absent from every other contract's canonical data).
    delta_rule_chunk: PositiveInt | None = Field(
        default=None,
        description=(
            "Tokens per chunk of the chunked gated delta rule; chunks start at absolute position "
            "0 of each sequence, so a prefill, a re-score and the trainer cut one sequence alike."
        ),
    )
    delta_rule_chunk_dtype: Dtype | None = Field(
        default=None,
        description=(
            "dtype of the delta rule's inputs after the conv (q, k l2-normalised, v, beta, the "
            "log-decay g) and of every intra-chunk product and the triangular solve."
        ),
    )
    delta_rule_state_dtype: Dtype | None = Field(
        default=None,
        description=(
            "dtype the recurrent state [v_heads, k_dim, v_dim] is carried, decayed and updated "
            "in between chunks (and between decode steps)."
        ),
    )
    delta_rule_solve: Literal["row_substitution", "lapack"] | None = Field(
        default=None,
        description=(
            "How each chunk's unit-lower-triangular system (I + strictly-lower(beta k kᵀ decay)) is "
            "inverted: 'row_substitution' (rows in ascending order, each row's sum over the earlier "
            "rows one fixed-order halving tree: the same bits on every device and batch) or "
            "'lapack' (torch.linalg.solve_triangular, whose blocking is the library's)."
        ),
    )
    conv_dtype: Dtype | None = Field(
        default=None,
        description=(
            "dtype of the causal depthwise conv over q/k/v (taps summed oldest first) and its "
            "SiLU; the output is rounded to dense_math_dtype."
        ),
    )
    gate_dtype: Dtype | None = Field(
        default=None,
        description=(
            "dtype every gate is computed and applied in: the attention output gate "
            "(sigmoid), the DeltaNet output gate (SiLU after its RMSNorm), beta (sigmoid), the "
            "log-decay (softplus) and the shared expert's gate (sigmoid); products rounded to "
            "dense_math_dtype."
        ),
    )
    shared_expert_combine: Literal["after_routed", "first_in_fold"] | None = Field(
        default=None,
        description=(
            "The shared expert's place in the MoE combine: 'after_routed' (the routed combine "
            "rounded to dense_math_dtype, then the gated shared output added in "
            "dense_math_dtype: HF's order) or 'first_in_fold' (the gated shared output is the "
            "first term of the moe_combine_dtype fold, one rounding for all)."
        ),
    )

    # LoRA (unmerged low-rank adapters): set exactly when the contract has a ``lora`` section
    # (absent from every other contract's canonical data, so their fingerprints do not move).
    # The adapter path of a target linear, on both sides: ``t = x·Aᵀ`` (rank r) then ``d = t·Bᵀ``,
    # scaled by alpha/r, added to the base linear's output (for a row-parallel linear: after
    # its all-reduce), then rounded to dense_math_dtype.
    lora_adapter_dtype: Dtype | None = Field(
        default=None,
        description=(
            "dtype A and B are pre-rounded to before either side's forward (the trainer's "
            "master copies may be wider; what both engines multiply with is this)."
        ),
    )
    lora_low_rank_dtype: Dtype | None = Field(
        default=None,
        description="dtype of the rank-r intermediate t = x·Aᵀ (the matmul's output dtype).",
    )
    lora_matmul: Literal["invariant", "stock"] | None = Field(
        default=None,
        description=(
            "Kernel of both low-rank matmuls: 'invariant' (the contract's batch-invariant "
            "matmul, its K tiles and tile order; a row-parallel layer's x·Aᵀ finishes its tree "
            "with the contract's all-reduce) or 'stock' (torch.matmul in the operand dtype)."
        ),
    )
    lora_scale_at: Literal["delta_output", "low_rank_output"] | None = Field(
        default=None,
        description=(
            "Where alpha/r multiplies: 'delta_output' (d = t·Bᵀ, before the add) or "
            "'low_rank_output' (t, before ·Bᵀ)."
        ),
    )
    lora_scale_dtype: Dtype | None = Field(
        default=None,
        description=(
            "dtype the scale alpha/r is held and multiplied in (the product is rounded back to "
            "the dtype of what it scales)."
        ),
    )
    lora_add_dtype: Dtype | None = Field(
        default=None,
        description=(
            "dtype d = t·Bᵀ is produced in and added to the base output in; the sum is rounded "
            "once to dense_math_dtype."
        ),
    )
    lora_serving: Literal["unmerged"] | None = Field(
        default=None,
        description=(
            "'unmerged': both sides run the adapter path beside the base weight. Serving merged "
            "weights (W + s·B·A rounded to the dense dtype) is other numerics, so another "
            "contract id: a rollout that merges is refused under this one."
        ),
    )

    @model_serializer(mode="wrap")
    def _omit_unset_optional(self, handler: SerializerFunctionWrapHandler) -> dict:
        # A contract's kernel policy serialises as before its unset optional fields existed.
        data = handler(self)
        for key in OPTIONAL_KERNEL_FIELDS:
            if key in data and data[key] is None:
                del data[key]
        return data


MOE_KERNEL_FIELDS = tuple(f for f in KernelPolicy.model_fields if f.startswith("moe_"))
# Kernel-policy fields absent from a contract's canonical data when unset, so the fingerprints
# of contracts written before they existed do not move.
LORA_KERNEL_FIELDS = tuple(f for f in KernelPolicy.model_fields if f.startswith("lora_"))
# Linear-attention fields (the hybrid families'), set exactly when the family has that block.
HYBRID_KERNEL_FIELDS = (
    "delta_rule_chunk",
    "delta_rule_chunk_dtype",
    "delta_rule_state_dtype",
    "delta_rule_solve",
    "conv_dtype",
    "gate_dtype",
    "shared_expert_combine",
)
OPTIONAL_KERNEL_FIELDS = (
    "matmul_k_runs",
    "matmul_column_k_runs",
    *MOE_KERNEL_FIELDS,
    *LORA_KERNEL_FIELDS,
    *HYBRID_KERNEL_FIELDS,
)
