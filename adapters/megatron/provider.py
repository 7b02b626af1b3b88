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
from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
    get_linear_attention_pattern,
)
from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec_for_backend
from megatron.core.transformer.attention import SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_layer import (
    TransformerLayerSubmodules,
    get_transformer_layer_offset,
)

from .attention import SGLangCoreAttention, SGLangSelfAttention
from .layers import (
    FINAL_NORM_BY_USE_SGLANG_FINAL_NORM,
    SGLangColumnParallelLinear,
    SGLangMLP,
    SGLangNorm,
    SGLangQKRMSNorm,
    SGLangRowParallelLinear,
)
from .linear_attention import (
    SGLangGatedDeltaNet,
    SGLangGatedDeltaNetSubmodules,
    SGLangGatedOutputNorm,
)
from .moe import SGLangMoELayer, SGLangSequentialMLP, SGLangSharedExpertMLP, SGLangTopKRouter
from .transformer_layer import SGLangTransformerLayer


class SGLangSpecProvider(BackendSpecProvider):
    """Backend spec provider for true-on-policy contracts (dense MLP and routed experts)."""

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
        """The routed experts: megatron's ``SequentialMLP`` (``SGLangSequentialMLP``) of ``MLP``s
        with this provider's linears. Grouped GEMM would batch experts with another reduction
        order, so it is refused."""
        if moe_use_grouped_gemm:
            raise ValueError(
                "true-on-policy MoE runs each expert through the batch-invariant linears; "
                "set moe_grouped_gemm=False"
            )
        return SGLangSequentialMLP, MLPSubmodules(
            linear_fc1=self.column_parallel_linear(), linear_fc2=self.row_parallel_linear()
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


def _dense_mlp_spec(config: Any, backend: BackendSpecProvider) -> ModuleSpec:
    """megatron's MLP slot: ``SGLangMLP`` with the backend's linears."""
    return ModuleSpec(
        module=SGLangMLP,
        params={"ffn_hidden_size": config.ffn_hidden_size},
        submodules=MLPSubmodules(
            linear_fc1=backend.column_parallel_linear(),
            linear_fc2=backend.row_parallel_linear(),
        ),
    )


def _moe_spec(config: Any, backend: BackendSpecProvider) -> ModuleSpec:
    """megatron's own MoE spec (``get_moe_module_spec_for_backend``: experts from the backend's
    ``grouped_mlp_modules``) with our ``MoELayer`` and router subclasses in its slots."""
    spec = get_moe_module_spec_for_backend(
        backend, num_experts=config.num_moe_experts, moe_grouped_gemm=config.moe_grouped_gemm
    )
    spec.module = SGLangMoELayer
    spec.submodules.router = SGLangTopKRouter
    if spec.submodules.shared_experts is not None:  # built only where the config has one
        spec.submodules.shared_experts.module = SGLangSharedExpertMLP
    return spec


# megatron's ``moe_layer_freq`` pattern entry (0 dense, 1 experts) -> the layer's MLP spec
MLP_SPEC_BY_MOE_PATTERN = {0: _dense_mlp_spec, 1: _moe_spec}


def moe_layer_pattern(config: Any) -> list[int]:
    """megatron's per-layer MoE pattern: ``config.moe_layer_freq`` as a list (``make_config`` sets
    it from the model family), or every layer dense when the config has no experts."""
    if config.num_moe_experts is None:
        return [0] * config.num_layers
    freq = config.moe_layer_freq
    if isinstance(freq, int):
        return [int(i % freq == 0) for i in range(config.num_layers)]
    return list(freq)


def _self_attention_spec(config: Any, backend: BackendSpecProvider) -> ModuleSpec:
    """Full (softmax) attention: megatron's ``SelfAttention`` tree with our classes; QK-norm when
    the family has it, the output gate when the config's ``attention_output_gate`` says."""
    qk_norm = backend.layer_norm(rms_norm=True, for_qk=True)
    return ModuleSpec(
        module=SGLangSelfAttention,
        params={"attn_mask_type": AttnMaskType.causal},
        submodules=SelfAttentionSubmodules(
            linear_qkv=backend.column_parallel_linear(),
            core_attention=backend.core_attention(),
            linear_proj=backend.row_parallel_linear(),
            q_layernorm=qk_norm if config.qk_layernorm else None,
            k_layernorm=qk_norm if config.qk_layernorm else None,
        ),
    )


def _gated_delta_net_spec(config: Any, backend: BackendSpecProvider) -> ModuleSpec:
    """Linear attention: ``SGLangGatedDeltaNet`` with the backend's linears."""
    return ModuleSpec(
        module=SGLangGatedDeltaNet,
        submodules=SGLangGatedDeltaNetSubmodules(
            in_proj=backend.column_parallel_linear(),
            out_norm=SGLangGatedOutputNorm,
            out_proj=backend.row_parallel_linear(),
        ),
    )


# megatron's ``linear_attention_freq`` pattern entry (0 full attention, 1 linear) -> mixer spec
MIXER_SPEC_BY_LINEAR_ATTENTION_PATTERN = {0: _self_attention_spec, 1: _gated_delta_net_spec}


def linear_attention_pattern(config: Any) -> list[int]:
    """megatron's per-layer mixer pattern (``config.linear_attention_freq``, which
    ``make_config`` sets from the family's ``mixer``), or every layer full attention."""
    if config.linear_attention_freq is None:
        return [0] * config.num_layers
    return get_linear_attention_pattern(config)


def get_sglang_layer_spec(config: Any, moe: int = 0, linear: int = 0) -> ModuleSpec:
    """One decoder layer's spec (RMSNorm, no bias), with the mixer slot of megatron's linear
    attention pattern entry ``linear`` (0: GQA self-attention, 1: Gated DeltaNet) and the MLP
    slot of its MoE pattern entry ``moe`` (0: SwiGLU MLP, 1: routed experts)."""
    policy = config.true_on_policy.rp
    backend = SPEC_PROVIDER_BY_USE_SGLANG_BACKEND[bool(policy.use_sglang_backend)]()
    norm = backend.layer_norm(rms_norm=True, for_qk=False)
    return ModuleSpec(
        module=SGLangTransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=norm,
            self_attention=MIXER_SPEC_BY_LINEAR_ATTENTION_PATTERN[linear](config, backend),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=norm,
            mlp=MLP_SPEC_BY_MOE_PATTERN[moe](config, backend),
            mlp_bda=get_bias_dropout_add,
        ),
    )


def get_sglang_block_spec(config: Any, vp_stage: int | None = None) -> TransformerBlockSubmodules:
    """The decoder block spec for this pipeline stage (each layer's mixer and MLP slots from
    megatron's linear-attention and MoE layer patterns at its global index), final norm
    included."""
    policy = config.true_on_policy.rp
    offset = get_transformer_layer_offset(config, vp_stage)
    moe, linear = moe_layer_pattern(config), linear_attention_pattern(config)
    n = get_num_layers_to_build(config, vp_stage)
    return TransformerBlockSubmodules(
        layer_specs=[
            get_sglang_layer_spec(config, moe[offset + i], linear[offset + i]) for i in range(n)
        ],
        layer_norm=FINAL_NORM_BY_USE_SGLANG_FINAL_NORM[bool(policy.use_sglang_final_norm)],
    )
