"""Llama 3 / 3.1 / 3.2 / 3.3 text models: no QK-norm, no attention bias, GQA, tied head on 3.2
1B/3B; RoPE (with or without llama3 scaling) is per checkpoint in the contract."""

from . import Family, _dense

FAMILY = Family(
    name="llama3_dense",
    hf_architectures=("LlamaForCausalLM",),
    hf_model_types=("llama",),
    qk_norm=False,
    attention_bias=False,
    tied_head=True,
    layer_weights=_dense.LAYER_WEIGHTS,
    model_weights=_dense.MODEL_WEIGHTS,
    activations=_dense.ACTIVATIONS,
    config_keys=_dense.CONFIG_KEYS,
    default_rms_norm_eps=1e-5,
)
