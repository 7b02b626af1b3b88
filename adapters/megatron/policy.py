"""Contract resolution for the Megatron side: config field -> generated runtime policy + KernelPolicy.

Everything here reads the *generated* modules (``contractgen.codegen.vendored.load_target("megatron")``),
the same code the Megatron-LM fork vendors, never the pydantic models.

``TrueOnPolicyTransformerConfig`` is megatron-core's ``TransformerConfig`` with the two fields the
public fork adds (``true_on_policy_contract``, ``true_on_policy_vocab_size``) plus two optional
fault-injection overrides; ``policy_for(config)`` / ``kernel_policy_for(config)`` are the only way
layer classes learn what to do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from megatron.core.transformer.transformer_config import TransformerConfig


@lru_cache(maxsize=1)
def generated() -> Any:
    """The generated megatron target (``.schema`` and ``.runtime_policy`` modules)."""
    from contractgen.codegen.vendored import load_target

    return load_target("megatron")


@dataclass
class TrueOnPolicyTransformerConfig(TransformerConfig):
    """``TransformerConfig`` that names a true-on-policy contract (as the public fork does)."""

    true_on_policy_contract: str | None = None
    """Contract id, e.g. ``"qwen3_dense_true_on_policy_v1"``; ``None`` means stock megatron."""

    true_on_policy_vocab_size: int | None = None
    """Real (unpadded) vocabulary size; logits past it are trimmed under ``apply_logits_contract``."""

    rotary_base: float = 10000.0
    """RoPE theta (megatron's ``GPTModel`` reads ``config.rotary_base`` when present)."""

    true_on_policy_rope_scaling: Any = None
    """The profile's ``rope_scaling`` (passed to ``kernels.rope.rope_cos_sin``)."""

    true_on_policy_max_position_embeddings: int = 0
    """Model's max positions (used by YaRN-style RoPE scaling)."""

    true_on_policy_runtime_policy_override: Any = None
    """Fault injection / diagnostics: a replaced ``MegatronTrueOnPolicyRuntimePolicy``."""

    true_on_policy_kernel_policy_override: Any = None
    """Fault injection / diagnostics: a replaced ``KernelPolicy``."""

    true_on_policy_moe_norm_topk_prob: bool | None = None
    """The checkpoint's ``norm_topk_prob`` (top-k weights renormalised), where megatron's
    ``moe_router_pre_softmax`` cannot say it: at top-1 megatron requires pre-softmax, while a
    renormalised single weight is 1. ``None``: ``not moe_router_pre_softmax``."""


def policy_for(config: Any) -> Any:
    """The runtime policy this config runs under (``DEFAULT_RUNTIME_POLICY`` without a contract)."""
    override = getattr(config, "true_on_policy_runtime_policy_override", None)
    rp = generated().runtime_policy
    if override is not None:
        return override if override.enabled else rp.DEFAULT_RUNTIME_POLICY
    contract = getattr(config, "true_on_policy_contract", None)
    if contract is None:
        return rp.DEFAULT_RUNTIME_POLICY
    policy = rp.policy_for(contract, config)
    return policy if policy.enabled else rp.DEFAULT_RUNTIME_POLICY


def kernel_policy_for(config: Any) -> Any:
    """The contract's ``KernelPolicy`` (override first); stock megatron has none."""
    override = getattr(config, "true_on_policy_kernel_policy_override", None)
    if override is not None:
        return override
    contract = getattr(config, "true_on_policy_contract", None)
    if contract is None:
        raise ValueError(
            "config.true_on_policy_contract is None: SGLang layer classes need a contract "
            f"(known: {', '.join(generated().schema.CONTRACT_IDS)})"
        )
    return generated().schema.kernel_policy_for(contract)


def model_profile_for(contract_id: str) -> Any:
    """The contract's ``ModelProfile`` (dims of the model the contract was written for)."""
    return generated().schema.model_profile_for(contract_id)


def dtype_of(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16`` (KernelPolicy dtype names are torch attribute names)."""
    return getattr(torch, name)


def float32_kernel_policy(kp: Any) -> Any:
    """Every dtype field of a KernelPolicy set to float32 (the gate's ``--dtype float32``)."""
    fields = {f.name: "float32" for f in dataclasses.fields(kp) if f.name.endswith("_dtype")}
    return dataclasses.replace(kp, **fields)
