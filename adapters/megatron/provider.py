"""``SGLangSpecProvider``: a megatron-core ``BackendSpecProvider`` whose modules are SGLang's.

``get_sglang_block_spec(config)`` builds the decoder spec the way megatron-core's
``get_gpt_layer_local_spec`` does (same ``ModuleSpec`` / ``SelfAttentionSubmodules`` /
``MLPSubmodules`` shape), from the provider picked by the runtime policy's
``use_sglang_backend``; the final norm is picked by ``use_sglang_final_norm``.
"""

from __future__ import annotations

from typing import Any

from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.backends import BackendSpecProvider, LocalSpecProvider
from megatron.core.transformer.attention import SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_layer import TransformerLayerSubmodules

from .attention import SGLangCoreAttention, SGLangSelfAttention
from .layers import (
    FINAL_NORM_BY_USE_SGLANG_FINAL_NORM,
    SGLangColumnParallelLinear,
    SGLangMLP,
    SGLangNorm,
    SGLangQKRMSNorm,
    SGLangRowParallelLinear,
)
from .policy import policy_for
from .transformer_layer import SGLangTransformerLayer


class SGLangSpecProvider(BackendSpecProvider):
    """Backend spec provider for true-on-policy contracts (dense models; MoE slot reserved)."""

    def column_parallel_linear(self) -> type:
        return SGLangColumnParallelLinear

    def row_parallel_linear(self) -> type:
        return SGLangRowParallelLinear

    def fuse_layernorm_and_linear(self) -> bool:
        return False

    def column_parallel_layer_norm_linear(self) -> type | None:
        return None

    def layer_norm(self, rms_norm: bool = False, for_qk: bool = False) -> type:
        if not rms_norm:
            raise ValueError("SGLangSpecProvider supports RMSNorm only (the dense families)")
        return SGLangQKRMSNorm if for_qk else SGLangNorm

    def core_attention(self) -> type:
        return SGLangCoreAttention

    def grouped_mlp_modules(self, moe_use_grouped_gemm: bool, moe_use_legacy_grouped_gemm: bool):
        raise NotImplementedError(
            "no MoE contract yet: SGLangSpecProvider.grouped_mlp_modules is reserved for "
            "qwen3_moe_true_on_policy_v1"
        )

    def activation_func(self) -> type | None:
        return None


class _StockOnSGLangLayers(SGLangSpecProvider):
    """``use_sglang_backend=False``: megatron-core's ``LocalSpecProvider`` modules."""

    def __init__(self) -> None:
        self._local = LocalSpecProvider()

    def column_parallel_linear(self) -> type:
        return self._local.column_parallel_linear()

    def row_parallel_linear(self) -> type:
        return self._local.row_parallel_linear()


SPEC_PROVIDER_BY_USE_SGLANG_BACKEND: dict[bool, type[BackendSpecProvider]] = {
    True: SGLangSpecProvider,
    False: _StockOnSGLangLayers,
}


def get_sglang_layer_spec(config: Any) -> ModuleSpec:
    """One decoder layer's spec (dense families: RMSNorm, QK-norm when the family has it, SwiGLU,
    no bias, GQA)."""
    policy = policy_for(config)
    backend = SPEC_PROVIDER_BY_USE_SGLANG_BACKEND[bool(policy.use_sglang_backend)]()
    norm = backend.layer_norm(rms_norm=True, for_qk=False)
    qk_norm = backend.layer_norm(rms_norm=True, for_qk=True)
    return ModuleSpec(
        module=SGLangTransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=norm,
            self_attention=ModuleSpec(
                module=SGLangSelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=backend.column_parallel_linear(),
                    core_attention=backend.core_attention(),
                    linear_proj=backend.row_parallel_linear(),
                    q_layernorm=qk_norm if config.qk_layernorm else None,
                    k_layernorm=qk_norm if config.qk_layernorm else None,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=norm,
            mlp=ModuleSpec(
                module=SGLangMLP,
                params={"ffn_hidden_size": config.ffn_hidden_size},
                submodules=MLPSubmodules(
                    linear_fc1=backend.column_parallel_linear(),
                    linear_fc2=backend.row_parallel_linear(),
                ),
            ),
            mlp_bda=get_bias_dropout_add,
        ),
    )


def get_sglang_block_spec(config: Any, vp_stage: int | None = None) -> TransformerBlockSubmodules:
    """The decoder block spec for this pipeline stage, final norm included."""
    policy = policy_for(config)
    layer = get_sglang_layer_spec(config)
    return TransformerBlockSubmodules(
        layer_specs=[layer] * get_num_layers_to_build(config, vp_stage),
        layer_norm=FINAL_NORM_BY_USE_SGLANG_FINAL_NORM[bool(policy.use_sglang_final_norm)],
    )
