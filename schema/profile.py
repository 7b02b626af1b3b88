"""The model profile of a contract (identity, architecture, dimensions) and the parallel
layouts it supports."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from .base import (
    MAX_SIZE,
    Identifier,
    PositiveInt,
    _Model,
)

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
