"""Qwen3-Next (Qwen3-Next-80B-A3B): a hybrid of Gated DeltaNet (linear attention) and gated full
attention, every ``full_attention_interval``-th layer full (HF ``layer_types``' default), with
Qwen3-MoE's routed experts plus an always-on shared expert behind a sigmoid gate.

Full attention: ``q_proj`` rows hold each head's query then its output gate (``2 * head_dim``
per head), QK-norm, partial RoPE, ``o_proj`` of the gated output. Linear attention:
``in_proj_qkvz`` rows grouped per key head (q, k, then the group's v and z heads), ``in_proj_ba``
per key head (the group's beta then decay inputs), a depthwise ``conv1d`` ``[conv_dim, 1, taps]``,
per-value-head ``dt_bias`` / ``A_log``, a gated RMSNorm over each value head, ``out_proj``
(row-parallel over the value heads). Every RMSNorm but the gated one is zero-centred."""

from . import Family, Hybrid, Weight, _dense, qwen3_moe


def is_linear_layer(dims, i: int) -> bool:
    """HF's default ``layer_types``: full attention where ``(i + 1) % interval == 0``."""
    return (i + 1) % dims.full_attention_interval != 0


def _key_dim(d):
    return d.linear_num_key_heads * d.linear_key_head_dim


def _value_dim(d):
    return d.linear_num_value_heads * d.linear_value_head_dim


def _conv_dim(d):
    return 2 * _key_dim(d) + _value_dim(d)


def _mixer(weight: Weight, mixer: str, shape=None) -> Weight:
    return Weight(
        weight.hf_name, shape or weight.shape, weight.shard, weight.k_field, weight.block,
        weight.init, mixer=mixer,
    )  # fmt: skip


def _conv_parts(d):
    """The conv's channels: all q heads, all k heads, all v heads (each split over TP)."""
    return (_key_dim(d), _key_dim(d), _value_dim(d))


ATTENTION = ("q", "k", "v", "o", "q_norm", "k_norm")
LINEAR = "linear_attention"

LAYER_WEIGHTS = {
    **{
        role: _mixer(w, "full_attention") if role in ATTENTION else w
        for role, w in qwen3_moe.LAYER_WEIGHTS.items()
    },
    # the query rows of each head are followed by its output-gate rows
    "q": _mixer(
        _dense.LAYER_WEIGHTS["q"],
        "full_attention",
        lambda d: (2 * d.num_attention_heads * d.head_dim, d.hidden_size),
    ),
    "qkvz": Weight(
        "linear_attn.in_proj_qkvz.weight",
        lambda d: (2 * _key_dim(d) + 2 * _value_dim(d), d.hidden_size),
        "column",
        mixer=LINEAR,
    ),
    "ba": Weight(
        "linear_attn.in_proj_ba.weight",
        lambda d: (2 * d.linear_num_value_heads, d.hidden_size),
        "column",
        mixer=LINEAR,
    ),
    "conv": Weight(
        "linear_attn.conv1d.weight",
        lambda d: (_conv_dim(d), 1, d.linear_conv_kernel_dim),
        "column",
        mixer=LINEAR,
        parts=_conv_parts,
    ),
    "dt_bias": Weight(
        "linear_attn.dt_bias",
        lambda d: (d.linear_num_value_heads,),
        "column",
        init="small",
        mixer=LINEAR,
    ),  # fmt: skip
    "A_log": Weight(
        "linear_attn.A_log",
        lambda d: (d.linear_num_value_heads,),
        "column",
        init="log_rate",
        mixer=LINEAR,
    ),  # fmt: skip
    "linear_norm": Weight(
        "linear_attn.norm.weight",
        lambda d: (d.linear_value_head_dim,),
        "replicated",
        init="norm",
        mixer=LINEAR,
    ),  # fmt: skip
    "out_proj": Weight(
        "linear_attn.out_proj.weight",
        lambda d: (d.hidden_size, _value_dim(d)),
        "row",
        k_field="linear_num_value_heads",
        mixer=LINEAR,
    ),
    "shared_gate": Weight(
        "mlp.shared_expert.gate_proj.weight",
        lambda d: (d.shared_expert_intermediate_size, d.hidden_size),
        "column",
        block="moe",
    ),
    "shared_up": Weight(
        "mlp.shared_expert.up_proj.weight",
        lambda d: (d.shared_expert_intermediate_size, d.hidden_size),
        "column",
        block="moe",
    ),
    "shared_down": Weight(
        "mlp.shared_expert.down_proj.weight",
        lambda d: (d.hidden_size, d.shared_expert_intermediate_size),
        "row",
        k_field="shared_expert_intermediate_size",
        block="moe",
    ),
    "shared_expert_gate": Weight(
        "mlp.shared_expert_gate.weight", lambda d: (1, d.hidden_size), "replicated", block="moe"
    ),
}

FAMILY = Family(
    name="qwen3_next",
    hf_architectures=("Qwen3NextForCausalLM",),
    hf_model_types=("qwen3_next",),
    qk_norm=True,
    attention_bias=False,
    tied_head=True,
    layer_weights=LAYER_WEIGHTS,
    model_weights=_dense.MODEL_WEIGHTS,
    activations=_dense.ACTIVATIONS,
    config_keys=_dense.CONFIG_KEYS,
    default_rms_norm_eps=1e-6,
    moe=qwen3_moe.FAMILY.moe,
    zero_centred_norm=True,
    hybrid=Hybrid(
        config_keys={
            "linear_num_key_heads": ("linear_num_key_heads",),
            "linear_num_value_heads": ("linear_num_value_heads",),
            "linear_key_head_dim": ("linear_key_head_dim",),
            "linear_value_head_dim": ("linear_value_head_dim",),
            "linear_conv_kernel_dim": ("linear_conv_kernel_dim",),
            "full_attention_interval": ("full_attention_interval",),
            "partial_rotary_factor": ("partial_rotary_factor",),
            "shared_expert_intermediate_size": ("shared_expert_intermediate_size",),
        },
        # Qwen3NextConfig's defaults for keys a config.json may omit
        defaults={"full_attention_interval": 4, "partial_rotary_factor": 0.25},
        is_linear_layer=is_linear_layer,
        extras=frozenset({"attention_output_gate", "shared_expert"}),
    ),
)
