"""The runtime policy per target: each switch a constant or a layout condition."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from .base import (
    Dtype,
    Identifier,
    _Model,
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


TARGET_POLICY_MODELS: dict[str, type[_Model]] = {
    "sglang": SGLangRuntimePolicy,
    "megatron": MegatronRuntimePolicy,
    "launcher": LauncherRuntimePolicy,
    "fsdp": FsdpRuntimePolicy,
}
