"""Pydantic models of a contract file: the single source of truth.

Validate at the edge, trust inside: every model forbids unknown keys and is frozen. Structural rules
live here (types, ranges, patterns); rules that relate one part of a contract to another live in
``rules.py`` so that each failure can name the exact field it is about.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

SCHEMA_VERSION = 1

Dtype = Literal["bfloat16", "float16", "float32"]
ContractId = Annotated[str, Field(pattern=r"^[a-z0-9_]+_v[0-9]+$", max_length=80)]
Identifier = Annotated[str, Field(pattern=r"^[a-z0-9_]+$", max_length=80)]
# Every size is bounded: 2**24 covers any real vocabulary, context length or width (with room),
# and keeps a hostile contract from making the tile-order proof or the generated tables huge.
MAX_SIZE = 2**24
PositiveInt = Annotated[int, Field(ge=1, le=MAX_SIZE)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# ---------------------------------------------------------------------------------------------
# Identity: what the public shared schema.py carries.


class Identity(_Model):
    """The cross-repo identity fields of the public ``TrueOnPolicyContractSchema``."""

    kernel_contracts: tuple[Identifier, ...] = Field(
        min_length=1, description="Names of the kernel contracts both engines must implement."
    )
    logprob_contract: Literal["sglang_prefill", "decode"] = Field(
        description=(
            "Which rollout logprobs the trainer must equal bitwise: 'sglang_prefill' (a prefill "
            "re-score of the finished sequence, the public v1) or 'decode' (the decode-step "
            "logprobs themselves, no re-score pass)."
        )
    )
    sglang_attention_backend: Identifier = Field(description="SGLang --attention-backend value.")
    fsdp_attention_implementation: Identifier = Field(
        description="attn_implementation an FSDP trainer would use for the same kernel family."
    )
    disable_megatron_sequence_parallel: bool = Field(
        description="Megatron sequence parallelism reorders the TP reduction; the contract turns it off."
    )


# ---------------------------------------------------------------------------------------------
# Model profile: the architecture the contract covers.


class NormSpec(_Model):
    kind: Literal["rmsnorm", "zero_centred_rmsnorm"] = Field(
        description=(
            "Normalisation kind: 'rmsnorm' (weight * normalize(x)) or 'zero_centred_rmsnorm' "
            "((1 + weight) * normalize(x), the weight stored centred on zero: Qwen3-Next)."
        )
    )
    eps: Annotated[float, Field(gt=0, lt=1)] = Field(description="Epsilon inside the rsqrt.")


class RopeScaling(_Model):
    type: Literal["linear", "yarn", "llama3"]
    factor: Annotated[float, Field(gt=0)]
    original_max_position_embeddings: PositiveInt | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None


class RopeSpec(_Model):
    style: Literal["neox"] = Field(description="Rotation layout: 'neox' rotates the two halves.")
    theta: Annotated[float, Field(gt=0)] = Field(description="RoPE base frequency.")
    scaling: RopeScaling | None = Field(default=None, description="HF-style rope_scaling, if any.")


class CheckpointRope(_Model):
    """A checkpoint's own RoPE, overriding the profile's (Llama 3.0 and 3.1 share a family but not
    a frequency schedule)."""

    theta: Annotated[float, Field(gt=0)] = Field(description="RoPE base frequency.")
    scaling: RopeScaling | None = Field(default=None, description="HF-style rope_scaling, if any.")


class ModelDims(_Model):
    """Dimensions of one known checkpoint (or of the tiny reference model)."""

    name: Annotated[str, Field(min_length=1, max_length=120)]
    hidden_size: PositiveInt
    intermediate_size: PositiveInt
    num_layers: PositiveInt
    num_attention_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    vocab_size: PositiveInt
    tie_word_embeddings: bool
    max_position_embeddings: PositiveInt
    tp_sizes: tuple[PositiveInt, ...] | None = Field(
        default=None,
        description=(
            "Subset of the contract's TP sizes (training and rollout) this checkpoint supports, when its "
            "dimensions rule some out (e.g. a K that does not split into whole tiles)."
        ),
    )
    pp_sizes: tuple[PositiveInt, ...] | None = Field(
        default=None,
        description=(
            "Subset of the contract's PP sizes this checkpoint supports, when its layer count rules "
            "some out (e.g. 126 layers and PP=4)."
        ),
    )
    rope: CheckpointRope | None = Field(
        default=None,
        description="This checkpoint's RoPE (theta, scaling) when it differs from model_profile.rope.",
    )
    # Mixture of experts (HF config.json names; set exactly when the family has an MoE block).
    num_experts: PositiveInt | None = Field(
        default=None, description="Routed experts per MoE layer (HF num_experts)."
    )
    num_experts_per_tok: PositiveInt | None = Field(
        default=None, description="Experts each token is routed to (top-k)."
    )
    moe_intermediate_size: PositiveInt | None = Field(
        default=None, description="FFN width of one expert (its down_proj K)."
    )
    norm_topk_prob: bool | None = Field(
        default=None,
        description="Renormalise the top-k routing weights to sum to one (the checkpoint's choice).",
    )
    decoder_sparse_step: PositiveInt | None = Field(
        default=None, description="Layer i is MoE when (i + 1) is a multiple of this."
    )
    mlp_only_layers: tuple[Annotated[int, Field(ge=0, le=MAX_SIZE)], ...] | None = Field(
        default=None, description="Layers that keep a dense MLP (intermediate_size) regardless."
    )
    tied_router_experts: tuple[Annotated[int, Field(ge=0, le=MAX_SIZE)], ...] | None = Field(
        default=None,
        description=(
            "Reference model only: experts whose router rows the seeded init makes equal, so "
            "their router logits tie for every token and the top-k tie-break decides between them."
        ),
    )

    # Hybrid linear attention (HF Qwen3-Next config.json names; set exactly when the family has
    # a linear-attention block).
    linear_num_key_heads: PositiveInt | None = Field(
        default=None, description="Gated DeltaNet query/key heads (HF linear_num_key_heads)."
    )
    linear_num_value_heads: PositiveInt | None = Field(
        default=None,
        description="Gated DeltaNet value heads, a multiple of the key heads (each key head serves "
        "linear_num_value_heads / linear_num_key_heads consecutive value heads).",
    )
    linear_key_head_dim: PositiveInt | None = Field(
        default=None, description="Width of one linear-attention query/key head."
    )
    linear_value_head_dim: PositiveInt | None = Field(
        default=None, description="Width of one linear-attention value head."
    )
    linear_conv_kernel_dim: PositiveInt | None = Field(
        default=None, description="Taps of the causal depthwise conv over q/k/v."
    )
    full_attention_interval: PositiveInt | None = Field(
        default=None,
        description="Layer i is full (gated softmax) attention when (i + 1) is a multiple of "
        "this, else linear attention (HF's default layer_types).",
    )
    partial_rotary_factor: Annotated[float, Field(gt=0, le=1)] | None = Field(
        default=None,
        description="Fraction of each full-attention head's dims RoPE rotates (the first ones).",
    )
    shared_expert_intermediate_size: PositiveInt | None = Field(
        default=None,
        description="FFN width of the always-on shared expert of each MoE layer (its down_proj K).",
    )

    @model_serializer(mode="wrap")
    def _omit_unset_optional(self, handler: SerializerFunctionWrapHandler) -> dict:
        # A checkpoint without its own rope / pp_sizes / MoE fields serialises as before those
        # fields existed, so the canonical data (and the fingerprint) of contracts that do not
        # use them is unchanged.
        data = handler(self)
        for key in (
            "pp_sizes",
            "rope",
            *MOE_DIMS_FIELDS,
            *HYBRID_DIMS_FIELDS,
            *REFERENCE_ONLY_DIMS_FIELDS,
        ):
            if key in data and data[key] is None:
                del data[key]
        return data


MOE_DIMS_FIELDS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
)
HYBRID_DIMS_FIELDS = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "full_attention_interval",
    "partial_rotary_factor",
    "shared_expert_intermediate_size",
)
# Properties of the seeded random reference model, never of a real checkpoint.
REFERENCE_ONLY_DIMS_FIELDS = ("tied_router_experts",)


class Architectures(_Model):
    hf: Annotated[str, Field(min_length=1)] = Field(description="transformers architecture class.")
    sglang: Annotated[str, Field(min_length=1)] = Field(description="SGLang model class.")
    megatron: Annotated[str, Field(min_length=1)] = Field(description="Megatron model provider.")


class ModelProfile(_Model):
    architectures: Architectures
    norm: NormSpec
    qk_norm: bool = Field(description="RMSNorm over each head of q and k before RoPE.")
    activation: Literal["silu_glu"] = Field(description="MLP activation: SiLU-gated linear unit.")
    attention_bias: bool = Field(description="Whether the QKV projections carry a bias.")
    rope: RopeSpec
    checkpoints: tuple[ModelDims, ...] = Field(
        min_length=1, description="Known checkpoints with their dimensions."
    )
    reference_model: ModelDims = Field(
        description="Tiny random-weight model the parity gate builds when no checkpoint is given."
    )


# ---------------------------------------------------------------------------------------------
# Parallel support.


class ContextParallel(_Model):
    kind: Literal["ulysses"] = Field(description="CP scheme: Ulysses all-to-all of heads.")
    sizes: tuple[PositiveInt, ...] = Field(min_length=1, description="Allowed CP sizes.")


class TrainingLayouts(_Model):
    tp: tuple[PositiveInt, ...] = Field(min_length=1, description="Allowed trainer TP sizes.")
    pp: tuple[PositiveInt, ...] = Field(min_length=1, description="Allowed pipeline sizes.")
    cp: ContextParallel
    dp: bool = Field(description="Data parallelism allowed.")
    sequence_parallel: bool = Field(description="Megatron sequence parallelism allowed.")
    ep: tuple[PositiveInt, ...] | None = Field(
        default=None,
        min_length=1,
        description=(
            "Allowed expert-parallel sizes (MoE contracts only; absent: EP 1). Under EP > 1 each "
            "rank holds whole experts (expert TP 1), folded over the TP, CP and DP ranks."
        ),
    )

    @model_serializer(mode="wrap")
    def _omit_unset_ep(self, handler: SerializerFunctionWrapHandler) -> dict:
        # A contract without expert parallelism serialises as before the field existed.
        data = handler(self)
        if data.get("ep") is None:
            data.pop("ep", None)
        return data


class RolloutLayouts(_Model):
    tp: tuple[PositiveInt, ...] = Field(min_length=1, description="Allowed rollout TP sizes.")
    dp: bool = Field(description="Rollout data parallelism allowed.")


class ParallelSupport(_Model):
    training: TrainingLayouts
    rollout: RolloutLayouts
    kv_heads: Literal["divide", "replicate"] = Field(
        default="divide",
        description=(
            "'divide': TP must divide the KV heads; 'replicate': when TP exceeds the KV heads, "
            "each KV head is replicated over TP / num_kv_heads ranks."
        ),
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


# ---------------------------------------------------------------------------------------------
# Runtime policy per target. A value is a constant or a layout condition.

LayoutCondition = Literal["rollout_tp", "train_tp", "ulysses_cp"]


class When(_Model):
    """A value that depends on the launch layout."""

    when: LayoutCondition = Field(
        description=(
            "'rollout_tp': rollout TP > 1; 'train_tp': trainer TP > 1; 'ulysses_cp': trainer "
            "CP > 1 with the a2a (Ulysses) comm type."
        )
    )
    value: bool | Identifier = Field(default=True, description="Value when the condition holds.")
    otherwise: bool | Identifier | None = Field(
        default=False, description="Value when it does not."
    )


class FromConfig(_Model):
    """A value copied from the engine's own config at start-up."""

    from_config: Identifier = Field(description="Attribute of the engine config to copy.")
    default: bool = Field(default=False, description="Value when the config lacks it.")


Flag = bool | When


class SGLangRuntimePolicy(_Model):
    """SGLang-side switches (the public SGLangTrueOnPolicyRuntimePolicy, 10 fields with name/enabled)."""

    enabled: bool = Field(description="The contract is active on the rollout engine.")
    force_bfloat16_dense_tensor_math: Flag = Field(
        description="Run every dense matmul in kernel_policy.dense_math_dtype (bf16)."
    )
    force_bfloat16_lm_head: Flag = Field(
        description="Run the LM head in kernel_policy.lm_head_input_dtype (bf16)."
    )
    disable_reduce_scatter: Flag = Field(
        description="Never reduce-scatter on the scored path: a reduce-scatter sums in NCCL's order."
    )
    disable_mlp_allreduce_fusion: Flag = Field(
        description="Keep the MLP all-reduce separate from the residual add (one rounding each)."
    )
    disable_flashinfer_allreduce_fusion: Flag = Field(
        description="Keep the attention all-reduce separate from the next residual add and norm."
    )
    tp_invariant_row_linear: Flag = Field(
        description="Row-parallel linears use the tile-ordered matmul so TP=N equals TP=1."
    )
    deterministic_tree_all_reduce: Flag = Field(
        description="TP reductions use the fixed-order tree all-reduce, not NCCL."
    )
    disable_fused_qk_norm_mrope: Flag = Field(
        description="QK-norm and RoPE run as separate kernels with the policy's roundings between."
    )


class MegatronRuntimePolicy(_Model):
    """Megatron-side switches (the public MegatronTrueOnPolicyRuntimePolicy, 18 fields)."""

    enabled: bool = Field(description="The contract is active on the trainer.")
    use_sglang_backend: bool = Field(description="Build layers from the SGLang spec provider.")
    batch_invariant_mode: bool | FromConfig = Field(
        description="Batch-invariant kernels; copied from the trainer config in the public stack."
    )
    disable_rope_fusion: bool = Field(description="RoPE by the policy kernel, not a fused kernel.")
    disable_bias_swiglu_fusion: bool = Field(
        description="SwiGLU by the policy kernel, not the fused bias-SwiGLU."
    )
    attention_backend: Identifier = Field(description="Trainer attention kernel family.")
    cp_layout: Identifier | None | When = Field(
        description="Context-parallel layout; 'ulysses_a2a' under Ulysses CP."
    )
    cast_attention_input_to_dense_math_dtype: bool = Field(
        description="Round hidden states to the dense math dtype before the QKV projection."
    )
    cast_qk_norm_input_before_weight_mul: bool = Field(
        description="QK-norm rounds to the input dtype before the weight multiply."
    )
    cast_qk_after_rope_to_dense_math_dtype: bool = Field(
        description="Round q and k to the dense math dtype after RoPE."
    )
    cast_lm_head_input_to_weight_dtype: bool = Field(
        description="Round the final hidden state to the LM-head weight dtype."
    )
    deterministic_row_parallel_reduce: bool = Field(
        description="Row-parallel reduction by the fixed-order tree (no sequence parallel)."
    )
    defer_ulysses_cp_loss_scaling_to_grad_sum: bool = Field(
        description="Under Ulysses CP scale gradients by cp/dp_cp instead of 1/dp_cp."
    )
    apply_logits_contract: bool = Field(
        description="Trim padded-vocab logits to the real vocabulary before log-softmax."
    )
    use_sglang_final_norm: bool = Field(
        description="Final norm adds the last residual and normalises as SGLang does."
    )
    use_sglang_residual_pair: bool = Field(
        description="Carry (output, residual) separately, as SGLang's layer communicator does."
    )
    use_ulysses_cp_recompute_fallback: bool | When = Field(
        description="Under Ulysses CP recompute attention instead of the fused CP path."
    )


class LauncherRuntimePolicy(_Model):
    """Launcher (Miles) switches: what the launch plan renders."""

    enabled: bool = Field(description="The launcher applies the contract.")
    enable_deterministic_inference: bool = Field(
        description="Pass --enable-deterministic-inference to SGLang."
    )
    transformer_impl: Literal["local", "transformer_engine"] = Field(
        description="Megatron --transformer-impl; the contract's layers need 'local'."
    )
    use_cpu_initialization: bool = Field(description="Megatron --use-cpu-initialization.")
    batch_invariant_mode: bool = Field(description="Megatron --batch-invariant-mode.")
    no_bias_swiglu_fusion: bool = Field(description="Megatron --no-bias-swiglu-fusion.")
    no_rope_fusion: bool = Field(description="Megatron --no-rope-fusion.")
    nccl_algo: Annotated[str, Field(pattern=r"^[A-Za-z0-9_,]+$")] | None = Field(
        description="NCCL_ALGO default (an existing value in the environment is kept)."
    )
    nvte_allow_nondeterministic_algo: bool = Field(
        description="NVTE_ALLOW_NONDETERMINISTIC_ALGO; false forbids non-deterministic TE kernels."
    )
    cublas_workspace_config: Annotated[str, Field(pattern=r"^:[0-9]+:[0-9]+$")] = Field(
        description="CUBLAS_WORKSPACE_CONFIG for deterministic cuBLAS."
    )
    deterministic_mode: bool = Field(description="Miles --deterministic-mode.")
    true_on_policy_mode: bool = Field(description="Miles --true-on-policy-mode.")
    recompute_logprobs_via_prefill: bool = Field(
        description="Miles --recompute-logprobs-via-prefill: re-score rollouts with one prefill."
    )


class FsdpRuntimePolicy(_Model):
    """FSDP-trainer switches: what miles' FSDP backend (``miles/backends/fsdp_utils``: its
    ``FSDPArgs``, ``PrecisionPolicy`` and actor) reads under a contract, under the same names."""

    enabled: bool = Field(
        description="The contract is active on the FSDP trainer (miles --true-on-policy-mode)."
    )
    attn_implementation: Identifier = Field(
        description=(
            "transformers attention implementation (miles --attn-implementation, from the "
            "identity's fsdp_attention_implementation): the name the contract's attention is "
            "registered under in transformers' AttentionInterface."
        )
    )
    batch_invariant_mode: bool = Field(
        description=(
            "Linear, norm, activation and LM head by the contract kernels (miles enables "
            "batch-invariant ops in true-on-policy mode); off: transformers' stock modules."
        )
    )
    param_dtype: Dtype = Field(
        description="FSDP MixedPrecisionPolicy param_dtype: the dtype parameters are gathered in."
    )
    reduce_dtype: Dtype = Field(
        description="FSDP MixedPrecisionPolicy reduce_dtype: the dtype gradients are reduced in."
    )
    keep_fp32_master: bool = Field(
        description="Sharded master parameters (and the optimizer's view of them) in float32."
    )


class RuntimePolicies(_Model):
    sglang: SGLangRuntimePolicy
    megatron: MegatronRuntimePolicy
    launcher: LauncherRuntimePolicy
    fsdp: FsdpRuntimePolicy | None = Field(
        default=None,
        description=(
            "The FSDP trainer's section; a contract without it is off on that target (every "
            "field its off value)."
        ),
    )

    @model_serializer(mode="wrap")
    def _omit_absent_targets(self, handler: SerializerFunctionWrapHandler) -> dict:
        # a contract written before a target existed serialises as before (same canonical data)
        data = handler(self)
        if data.get("fsdp") is None:
            data.pop("fsdp", None)
        return data


# ---------------------------------------------------------------------------------------------
# LoRA: which adapters a contract admits (their numerics are the kernel policy's lora_* fields).

LoraTarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraSupport(_Model):
    """The adapters a LoRA contract admits. Dense linears only: MoE experts' LoRA is not part of
    any contract yet (a LoRA section on an MoE family is refused)."""

    target_modules: tuple[LoraTarget, ...] = Field(
        min_length=1,
        description=(
            "Linears that carry an adapter, by their Hugging Face / PEFT module name; each must "
            "be a column- or row-parallel linear of the family. Column-parallel (q/k/v, "
            "gate/up): A replicated on every TP rank, B split by output rows. Row-parallel "
            "(o, down): A split by input columns (x·Aᵀ's partial sums finished by the "
            "contract's all-reduce), B replicated."
        ),
    )
    max_rank: PositiveInt = Field(
        description="Largest adapter rank r (1 <= r <= max_rank); the trainer's --lora-rank bound."
    )
    max_alpha: Annotated[float, Field(gt=0, le=MAX_SIZE)] = Field(
        description="Largest lora_alpha (0 < alpha <= max_alpha); the scale is alpha / r."
    )
    dropout: Annotated[float, Field(ge=0, le=0)] = Field(
        description=(
            "LoRA dropout: 0 (a dropout mask is a second random draw the rollout cannot make)."
        )
    )


# ---------------------------------------------------------------------------------------------
# The contract.


class Contract(_Model):
    """One true-on-policy contract: an id that names exact numerics."""

    schema_version: Literal[1] = Field(description="Version of the contract file format.")
    id: ContractId = Field(description="Contract id, e.g. qwen3_dense_true_on_policy_v1.")
    family: Identifier = Field(description="Model family, e.g. qwen3_dense.")
    description: Annotated[str, Field(min_length=1)] = Field(description="What and why.")
    supersedes: ContractId | None = Field(
        default=None, description="Id of the contract this one replaces."
    )
    identity: Identity
    model_profile: ModelProfile
    parallel: ParallelSupport
    kernel_policy: KernelPolicy
    runtime_policy: RuntimePolicies
    lora: LoraSupport | None = Field(
        default=None,
        description=(
            "LoRA adapters under this contract (numerics: kernel_policy.lora_*); absent: the "
            "contract serves and trains base weights only."
        ),
    )
    unobservable: dict[
        Annotated[str, Field(pattern=r"^(kernel_policy|runtime_policy\.[a-z]+)\.[a-z0-9_]+$")],
        Annotated[str, Field(min_length=1)],
    ] = Field(
        default_factory=dict,
        description=(
            "Policy fields whose flip the parity gate cannot make visible in the forward "
            "logprobs under this contract's numerics, keyed by field path, each with why the "
            "field exists and where it is tested instead. The gate reports these faults as "
            "explained instead of undetected, and fails if one of them is detected after all."
        ),
    )

    @model_serializer(mode="wrap")
    def _omit_absent_lora(self, handler: SerializerFunctionWrapHandler) -> dict:
        # A contract without adapters serialises as before the lora section existed.
        data = handler(self)
        if data.get("lora", ...) is None:
            del data["lora"]
        return data


TARGET_POLICY_MODELS: dict[str, type[_Model]] = {
    "sglang": SGLangRuntimePolicy,
    "megatron": MegatronRuntimePolicy,
    "launcher": LauncherRuntimePolicy,
    "fsdp": FsdpRuntimePolicy,
}
