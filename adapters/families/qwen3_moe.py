"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (QK-norm, no bias) with a routed
mixture-of-experts MLP in every layer that ``is_moe_layer`` picks (HF ``Qwen3MoeDecoderLayer``:
not in ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``); the other layers keep the
dense SwiGLU MLP of width ``intermediate_size``. Router ``mlp.gate.weight`` ``[E, hidden]``
(replicated under TP), experts ``mlp.experts.{e}.{gate,up,down}_proj.weight`` sharded as the
dense MLP is (gate/up by rows, down by K)."""

from . import Family, MoE, Weight, _dense


def _retag(weight: Weight, block: str) -> Weight:
    return Weight(weight.hf_name, weight.shape, weight.shard, weight.k_field, block, weight.init)


def is_moe_layer(dims, i: int) -> bool:
    """HF's rule: an MoE block unless listed in ``mlp_only_layers`` or off the sparse step."""
    return (
        i not in (dims.mlp_only_layers or ())
        and dims.num_experts > 0
        and (i + 1) % dims.decoder_sparse_step == 0
    )


DENSE_MLP = ("gate", "up", "down")

LAYER_WEIGHTS = {
    **{
        role: _retag(w, "dense_mlp") if role in DENSE_MLP else w
        for role, w in _dense.LAYER_WEIGHTS.items()
    },
    "router": Weight(
        "mlp.gate.weight", lambda d: (d.num_experts, d.hidden_size), "replicated", block="moe"
    ),
    "expert_gate": Weight(
        "mlp.experts.{e}.gate_proj.weight",
        lambda d: (d.moe_intermediate_size, d.hidden_size),
        "column",
        block="moe",
        per_expert=True,
    ),
    "expert_up": Weight(
        "mlp.experts.{e}.up_proj.weight",
        lambda d: (d.moe_intermediate_size, d.hidden_size),
        "column",
        block="moe",
        per_expert=True,
    ),
    "expert_down": Weight(
        "mlp.experts.{e}.down_proj.weight",
        lambda d: (d.hidden_size, d.moe_intermediate_size),
        "row",
        k_field="moe_intermediate_size",
        block="moe",
        per_expert=True,
    ),
}

FAMILY = Family(
    name="qwen3_moe",
    hf_architectures=("Qwen3MoeForCausalLM",),
    hf_model_types=("qwen3_moe",),
    qk_norm=True,
    attention_bias=False,
    tied_head=True,
    layer_weights=LAYER_WEIGHTS,
    model_weights=_dense.MODEL_WEIGHTS,
    activations=_dense.ACTIVATIONS,
    config_keys=_dense.CONFIG_KEYS,
    default_rms_norm_eps=1e-6,
    moe=MoE(
        # transformers 4.x writes num_experts; 5.x saves the same value as num_local_experts
        config_keys={
            "num_experts": ("num_experts", "num_local_experts"),
            "num_experts_per_tok": ("num_experts_per_tok",),
            "moe_intermediate_size": ("moe_intermediate_size",),
            "norm_topk_prob": ("norm_topk_prob",),
            "decoder_sparse_step": ("decoder_sparse_step",),
            "mlp_only_layers": ("mlp_only_layers",),
        },
        # Qwen3MoeConfig's defaults for keys a config.json may omit
        defaults={"norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": ()},
        is_moe_layer=is_moe_layer,
    ),
)
