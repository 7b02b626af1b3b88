"""Contract resolution for the Megatron side: config fields -> one ``MegatronPolicy``.

Everything here reads the *generated* modules (``contractgen.codegen.vendored.load_target("megatron")``),
the same code the Megatron-LM fork vendors, never the pydantic models.

``TrueOnPolicyTransformerConfig`` is megatron-core's ``TransformerConfig`` with the two fields the
public fork adds (``true_on_policy_contract``, ``true_on_policy_vocab_size``) plus optional
fault-injection inputs. Making the config resolves its policies once (``resolve``, from
``__post_init__``) into ``config.true_on_policy``, a ``MegatronPolicy``: the typed
``KernelPolicy`` and the generated runtime policy. Layer classes read that attribute; nothing
below the config looks a policy up again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from megatron.core.transformer.transformer_config import TransformerConfig

from ..common.run_types import with_fault
from ..kernels.policy import KernelPolicy, kernel_policy
from .profile import generated, model_profile_for  # noqa: F401 (names kept here)


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

    true_on_policy_runtime_policy_changes: Mapping[str, Any] = field(default_factory=dict)
    """Fault injection: runtime-policy fields flipped on the resolved policy (a trainer fault)."""

    true_on_policy_kernel_policy_override: Any = None
    """The ``KernelPolicy`` to run instead of the contract's (``make_config`` passes the one it
    resolved, a run's dtype override and faults applied)."""

    true_on_policy_moe_norm_topk_prob: bool | None = None
    """The checkpoint's ``norm_topk_prob`` (top-k weights renormalised), where megatron's
    ``moe_router_pre_softmax`` cannot say it: at top-1 megatron requires pre-softmax, while a
    renormalised single weight is 1. ``None``: ``not moe_router_pre_softmax``."""

    rotary_percent: float = 1.0
    """Share of each head's dims RoPE rotates (the first ones; megatron's ``GPTModel`` takes it as
    an argument, our core attention reads it here): a family's ``partial_rotary_factor``."""

    true_on_policy: MegatronPolicy | None = field(default=None, init=False)
    """The policies this config runs under, resolved once when the config is made."""

    def __post_init__(self) -> None:
        refuse_linear_attention_cp(self)
        super().__post_init__()
        self.true_on_policy = resolve(self)


def refuse_linear_attention_cp(config: Any) -> None:
    """One line instead of megatron-core's assertion: context parallelism splits a sequence's
    tokens over ranks, and a Gated DeltaNet layer's recurrent state runs through every token in
    order; the state hand-off between CP ranks is not built."""
    if (
        config.experimental_attention_variant == "gated_delta_net"
        and config.context_parallel_size > 1
    ):
        raise ValueError(
            f"context parallelism (CP={config.context_parallel_size}) is not built for "
            "linear-attention (Gated DeltaNet) layers: their recurrent state runs through every "
            "token of a sequence in order and no CP rank hands it to the next; use CP 1"
        )


@dataclass(frozen=True)
class MegatronPolicy:
    """One model's policies: ``kp`` (the contract's ``KernelPolicy``; ``None`` for stock megatron,
    which names no contract) and ``rp`` (``MegatronTrueOnPolicyRuntimePolicy``, or
    ``DEFAULT_RUNTIME_POLICY`` when disabled or without a contract)."""

    kp: KernelPolicy | None
    rp: Any

    @property
    def kernel(self) -> KernelPolicy:
        """``kp``, for the SGLang layer classes, which need a contract."""
        if self.kp is None:
            raise ValueError(
                "config.true_on_policy_contract is None: SGLang layer classes need a contract "
                f"(known: {', '.join(generated().schema.CONTRACT_IDS)})"
            )
        return self.kp


def resolve(config: Any) -> MegatronPolicy:
    """The policies ``config`` names: its overrides first, then its contract, faults applied."""
    rp_module = generated().runtime_policy
    contract = config.true_on_policy_contract
    rp = config.true_on_policy_runtime_policy_override
    if rp is None:
        rp = (
            rp_module.DEFAULT_RUNTIME_POLICY
            if contract is None
            else rp_module.policy_for(contract, config)
        )
    if config.true_on_policy_runtime_policy_changes:
        rp = with_fault(rp, config.true_on_policy_runtime_policy_changes)
    if not rp.enabled:
        rp = rp_module.DEFAULT_RUNTIME_POLICY
    kp = config.true_on_policy_kernel_policy_override
    if kp is None and contract is not None:
        kp = generated().schema.kernel_policy_for(contract)
    return MegatronPolicy(kp=None if kp is None else kernel_policy(kp), rp=rp)


def dtype_of(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16`` (KernelPolicy dtype names are torch attribute names)."""
    return getattr(torch, name)
