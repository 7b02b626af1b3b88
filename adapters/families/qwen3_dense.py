"""Qwen3 dense (0.6B … 32B): per-head QK-norm before RoPE, no attention bias, tied head on the
small checkpoints."""

from . import Family, _dense

FAMILY = Family(
    name="qwen3_dense",
    hf_architectures=("Qwen3ForCausalLM",),
    hf_model_types=("qwen3",),
    qk_norm=True,
    attention_bias=False,
    tied_head=True,
    layer_weights=_dense.LAYER_WEIGHTS,
    model_weights=_dense.MODEL_WEIGHTS,
    activations=_dense.ACTIVATIONS,
    config_keys=_dense.CONFIG_KEYS,
    default_rms_norm_eps=1e-6,
)
