"""The model description every target builds from: ``ModelArch`` (a model profile and one of its
``ModelDims``), its weight names and shapes (from the family), seeded random weights, the weight
check, and the one vocab-padding rule.

Weights keep Hugging Face names (``model.layers.{i}.self_attn.q_proj.weight`` …, ``lm_head.weight``)
so every side loads the same checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..families import Family, family_for
from ..kernels.mlp import silu_glu
from ..kernels.rope import apply_rope

ACTIVATIONS = {"silu_glu": silu_glu}
ROPE_STYLES = {"neox": apply_rope}


@dataclass(frozen=True)
class ModelArch:
    """Everything the forward pass needs from a model profile and one of its ``ModelDims``."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    norm_eps: float
    qk_norm: bool
    rope_theta: float
    rope_scaling: tuple | None = None
    activation: str = "silu_glu"
    rope_style: str = "neox"
    family: str = "qwen3_dense"
    # mixture of experts (None for dense models; the family says which layers are MoE)
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    norm_topk_prob: bool | None = None
    decoder_sparse_step: int | None = None
    mlp_only_layers: tuple[int, ...] | None = None
    tied_router_experts: tuple[int, ...] | None = None
    """Reference model only: experts whose router rows ``random_weights`` makes equal."""
    # hybrid linear attention (None outside hybrid families; the family says which layers)
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel_dim: int | None = None
    full_attention_interval: int | None = None
    partial_rotary_factor: float | None = None
    shared_expert_intermediate_size: int | None = None

    @property
    def spec(self) -> Family:
        """The family description (weight names, sharding, optional blocks)."""
        return family_for(self.family)

    @classmethod
    def from_profile(cls, profile, dims=None) -> ModelArch:
        """From a generated ``ModelProfile`` and one ``ModelDims`` (default: its reference model);
        RoPE is the checkpoint's own (the generated dims carry it resolved)."""
        dims = dims or profile.reference_model
        family = family_for(profile.family)
        for what, value, known in (
            ("activation", profile.activation, ACTIVATIONS),
            ("rope_style", profile.rope_style, ROPE_STYLES),
        ):
            if value not in known:
                raise ValueError(
                    f"model profile {what}={value!r} is not supported; known: {sorted(known)}"
                )
        if profile.attention_bias:
            raise ValueError(
                "model profile attention_bias=True is not supported by the reference model"
            )
        scaling = dims.rope_scaling
        if isinstance(scaling, dict):
            scaling = tuple(sorted(scaling.items()))
        return cls(
            name=dims.name,
            hidden_size=dims.hidden_size,
            intermediate_size=dims.intermediate_size,
            num_layers=dims.num_layers,
            num_attention_heads=dims.num_attention_heads,
            num_kv_heads=dims.num_kv_heads,
            head_dim=dims.head_dim,
            vocab_size=dims.vocab_size,
            tie_word_embeddings=dims.tie_word_embeddings,
            max_position_embeddings=dims.max_position_embeddings,
            norm_eps=profile.norm_eps,
            qk_norm=profile.qk_norm,
            rope_theta=dims.rope_theta,
            rope_scaling=scaling,
            activation=profile.activation,
            rope_style=profile.rope_style,
            family=family.name,
            **{f: getattr(dims, f) for f in (family.moe.config_keys if family.moe else ())},
            **{f: getattr(dims, f) for f in (family.hybrid.config_keys if family.hybrid else ())},
            tied_router_experts=dims.tied_router_experts,
        )


def rotary_dim(arch: ModelArch) -> int:
    """Dims of each head RoPE rotates: all, or ``partial_rotary_factor`` of them (the first)."""
    return int(arch.head_dim * (arch.partial_rotary_factor or 1.0))


def weight_shapes(arch: ModelArch) -> dict[str, tuple[int, ...]]:
    """Every HF-named tensor of the model and its full (unsharded) shape (from the family)."""
    return arch.spec.weight_shapes(arch, qk_norm=arch.qk_norm)


def random_weights(arch: ModelArch, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded float32 weights: linears ~ N(0, 1/fan_in), embeddings ~ N(0, 1), norms ~ 1 + N(0, 0.1²).
    With ``arch.tied_router_experts`` (the contract's reference model), every MoE layer's router
    rows of those experts are copies of the first one's: their logits tie for every token."""
    g = torch.Generator().manual_seed(seed)
    init = {
        "norm": lambda shape: 1.0 + 0.1 * torch.randn(shape, generator=g),
        "embedding": lambda shape: torch.randn(shape, generator=g),
        "linear": lambda shape: torch.randn(shape, generator=g) / math.sqrt(shape[1]),
        "small": lambda shape: 0.1 * torch.randn(shape, generator=g),
        # log of per-head decay rates in [0.01, 0.1): states that carry over tens of tokens
        "log_rate": lambda shape: torch.log(0.01 + 0.09 * torch.rand(shape, generator=g)),
    }
    specs = arch.spec.weights(arch, qk_norm=arch.qk_norm)
    weights = {name: init[w.init](w.shape(arch)) for name, w in specs.items()}
    if arch.tied_router_experts:
        first, *others = arch.tied_router_experts
        router = arch.spec.layer_weights["router"]
        for name in [n for n, w in specs.items() if w is router]:
            weights[name][list(others)] = weights[name][first].clone()
    return weights


def check_weights(
    arch: ModelArch, weights: dict[str, torch.Tensor], where: str = "weights"
) -> None:
    """Every expected tensor present with its shape; clear error otherwise."""
    expected = weight_shapes(arch)
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ValueError(
            f"{where}: missing tensors for {arch.name}: {', '.join(missing[:5])}"
            + (" …" if len(missing) > 5 else "")
        )
    bad = [
        f"{n}: {tuple(weights[n].shape)} (expected {s})"
        for n, s in expected.items()
        if tuple(weights[n].shape) != s
    ]
    if bad:
        raise ValueError(
            f"{where}: tensors of the wrong shape for {arch.name}: " + "; ".join(bad[:5])
        )


def hf_config_keys(family: Family, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """``ModelDims`` field -> the transformers config key it is saved under, from the one table:
    the family's own (``families/_dense.CONFIG_KEYS``), then its MoE and hybrid fields under their
    first (current) key; ``skip``: fields the caller passes another way."""
    keys = dict(family.config_keys)
    for block in (family.moe, family.hybrid):
        keys |= {f: names[0] for f, names in (block.config_keys.items() if block else ())}
    return {f: k for f, k in keys.items() if f not in skip}
