"""Build a megatron-core ``GPTModel`` for a contract, on CPU (gloo) or CUDA.

``SGLangGPTModel`` *is* a ``megatron.core.models.gpt.GPTModel`` (subclass): embedding,
``TransformerBlock``, pipeline stage split (``pre_process`` / ``post_process``, layer offsets) and
state-dict names are megatron-core's. It differs in two places: the decoder spec comes from
``SGLangSpecProvider`` and the LM head is an ``SGLangOutputLayer`` (megatron's ``GPTModel``
hard-codes ``tensor_parallel.ColumnParallelLinear`` there; the parameter object, with its
tied-embedding attributes, is carried over unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.enums import AttnBackend

from contractgen.adapters.common.layout import Layout, padded_vocab
from contractgen.adapters.common.model import ModelArch
from contractgen.adapters.kernels import policy as kernel_policies
from contractgen.adapters.kernels.policy import KernelPolicy

from .layers import SGLangOutputLayer
from .policy import TrueOnPolicyTransformerConfig, dtype_of, generated
from .profile import arch_for, checkpoint_arch, load_checkpoint  # noqa: F401 (names kept here)
from .provider import get_sglang_block_spec


def padded_vocab_size(arch: ModelArch, tp: int, kp: KernelPolicy) -> int:
    """Vocab padded so every TP shard is a whole number of log-softmax vocab blocks (which are
    themselves whole matmul column tiles), as vocab-parallel log-softmax requires."""
    return padded_vocab(arch.vocab_size, tp, int(kp.logsoftmax_vocab_block))


def make_config(
    contract_id: str,
    arch: ModelArch,
    layout: Layout,
    *,
    runtime_policy: Any = None,
    kernel_policy: KernelPolicy | None = None,
    runtime_changes: Mapping[str, Any] | None = None,
) -> TrueOnPolicyTransformerConfig:
    """``TransformerConfig`` for the contract on the given layout (CPU-capable settings:
    ``use_cpu_initialization``, ``transformer_impl='local'``, no fusions, no dropout), its
    policies resolved once into ``config.true_on_policy``: ``runtime_policy`` / ``kernel_policy``
    replace the contract's, ``runtime_changes`` flips fields of the resolved runtime policy."""
    kp = kernel_policies.kernel_policy(  # the parameter ``kernel_policy`` shadows the function
        kernel_policy
        if kernel_policy is not None
        else generated().schema.kernel_policy_for(contract_id)
    )
    dense = dtype_of(kp.dense_math_dtype)
    return TrueOnPolicyTransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.intermediate_size,
        layernorm_epsilon=arch.norm_eps,
        rotary_base=arch.rope_theta,
        normalization="RMSNorm",
        qk_layernorm=arch.qk_norm,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=dense,
        bf16=dense == torch.bfloat16,
        pipeline_dtype=dense,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        context_parallel_size=layout.cp,
        cp_comm_type="a2a" if layout.cp > 1 else None,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=1 if layout.ep > 1 else layout.tp,
        sequence_parallel=False,
        use_cpu_initialization=True,
        perform_initialization=True,
        transformer_impl="local",
        batch_invariant_mode=True,
        attention_backend=AttnBackend.flash,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        true_on_policy_contract=contract_id,
        true_on_policy_vocab_size=arch.vocab_size,
        true_on_policy_rope_scaling=arch.rope_scaling,
        true_on_policy_max_position_embeddings=arch.max_position_embeddings,
        true_on_policy_runtime_policy_override=runtime_policy,
        true_on_policy_runtime_policy_changes=dict(runtime_changes or {}),
        true_on_policy_kernel_policy_override=kp,
        **moe_config_fields(arch, kp),
        **hybrid_config_fields(arch),
    )


# KernelPolicy ``moe_router_logits_dtype`` -> megatron's ``moe_router_dtype`` (None: input dtype)
MOE_ROUTER_DTYPE = {"bfloat16": None, "float32": "fp32", "float64": "fp64"}


def moe_config_fields(arch: ModelArch, kp: KernelPolicy) -> dict[str, Any]:
    """megatron's MoE fields for ``arch``: ``moe_layer_freq`` as the family's per-layer pattern
    (1 where ``Family.layer_blocks`` has ``"moe"``), and, when some layer is MoE, the experts'
    dims. ``norm_topk_prob`` is megatron's ``moe_router_pre_softmax=False`` (select on the
    scores, then renormalise the top k), except at top-1, where megatron requires pre-softmax:
    the router reads ``true_on_policy_moe_norm_topk_prob`` instead. No auxiliary loss, no
    grouped GEMM, no shared experts; EP and expert TP come from the layout (``make_config``). A dense model gets an all-zero pattern and nothing else."""
    pattern = [int("moe" in arch.spec.layer_blocks(arch, i)) for i in range(arch.num_layers)]
    if not any(pattern):
        return {"moe_layer_freq": pattern}
    return {
        **shared_expert_fields(arch),
        "moe_layer_freq": pattern,
        "num_moe_experts": arch.num_experts,
        "moe_router_topk": arch.num_experts_per_tok,
        "moe_ffn_hidden_size": arch.moe_intermediate_size,
        "moe_router_pre_softmax": not arch.norm_topk_prob or arch.num_experts_per_tok == 1,
        "true_on_policy_moe_norm_topk_prob": arch.norm_topk_prob,
        "moe_router_score_function": "softmax",
        "moe_router_dtype": MOE_ROUTER_DTYPE[kp.moe_router_logits_dtype],
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_token_dispatcher_type": "allgather",
        "moe_grouped_gemm": False,
        "moe_permute_fusion": False,
    }


def shared_expert_fields(arch: ModelArch) -> dict[str, Any]:
    """megatron's shared-expert fields where the family has a shared expert (Qwen3-Next: one
    always-on expert of ``shared_expert_intermediate_size`` behind a sigmoid gate)."""
    extras = arch.spec.hybrid.extras if arch.spec.hybrid is not None else frozenset()
    if "shared_expert" not in extras:
        return {}
    return {
        "moe_shared_expert_intermediate_size": arch.shared_expert_intermediate_size,
        "moe_shared_expert_gate": True,
    }


def hybrid_config_fields(arch: ModelArch) -> dict[str, Any]:
    """megatron's own fields for a family's optional blocks: zero-centred norms
    (``layernorm_zero_centered_gamma``), partial RoPE (``rotary_percent``), the attention output
    gate, and for a hybrid family the per-layer mixer pattern (``linear_attention_freq``, 1 where
    ``Family.mixer`` says linear attention) with the Gated DeltaNet dims. A plain family gets the
    defaults."""
    family = arch.spec
    out: dict[str, Any] = {
        "layernorm_zero_centered_gamma": family.zero_centred_norm,
        "rotary_percent": float(arch.partial_rotary_factor or 1.0),
    }
    if family.hybrid is None:
        return out
    out["attention_output_gate"] = "attention_output_gate" in family.hybrid.extras
    pattern = [int(family.mixer(arch, i) == "linear_attention") for i in range(arch.num_layers)]
    if any(pattern):
        out |= {
            "experimental_attention_variant": "gated_delta_net",
            "linear_attention_freq": pattern,
            **{f: getattr(arch, f) for f in LINEAR_ATTENTION_DIMS},
        }
    return out


# ModelArch fields megatron's config names alike (the Gated DeltaNet dims)
LINEAR_ATTENTION_DIMS = (
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
)


class SGLangGPTModel(GPTModel):
    """megatron-core ``GPTModel`` with the SGLang spec and an ``SGLangOutputLayer`` LM head."""

    def __init__(self, config: TrueOnPolicyTransformerConfig, **kwargs: Any) -> None:
        kwargs.setdefault("transformer_layer_spec", get_sglang_block_spec(config))
        kwargs.setdefault("position_embedding_type", "none")
        super().__init__(config=config, **kwargs)
        if self.post_process:
            old = self.output_layer
            new = SGLangOutputLayer(
                config.hidden_size,
                self.vocab_size,
                config=config,
                init_method=config.init_method,
                bias=False,
                skip_bias_add=False,
                gather_output=False,
                skip_weight_param_allocation=old.weight is None,
                tp_group=self.pg_collection.tp,
            )
            if old.weight is not None:
                new.weight = old.weight
            self.output_layer = new


def build_model(
    config: TrueOnPolicyTransformerConfig,
    arch: ModelArch,
    *,
    pre_process: bool,
    post_process: bool,
    padded_vocab_size: int,
    max_sequence_length: int = 4096,
) -> SGLangGPTModel:
    """One pipeline stage of the model (megatron-core decides which layers it holds).

    Tied embeddings split over pipeline stages: megatron-core syncs the last stage's copy with a
    ``.cuda()`` all-reduce, so on CPU such a model is built untied and both copies are loaded from
    the same HF tensor (identical forward; a CPU *training* run would also need the
    embedding-group gradient all-reduce).
    """
    tied = arch.tie_word_embeddings and (
        config.pipeline_model_parallel_size == 1 or torch.cuda.is_available()
    )
    return SGLangGPTModel(
        config,
        vocab_size=padded_vocab_size,
        max_sequence_length=max_sequence_length,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=tied,
    )
