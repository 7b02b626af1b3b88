"""The weights of a dense pre-norm GQA decoder with Hugging Face's Llama-style names, shared by
the dense families (Qwen3, Llama 3): attention q/k/v (column), o (row), SwiGLU gate/up (column),
down (row), optional per-head QK-norm, embedding and LM head sharded by vocab rows."""

from __future__ import annotations

from . import Weight


def _q(d):
    return d.num_attention_heads * d.head_dim


def _kv(d):
    return d.num_kv_heads * d.head_dim


LAYER_WEIGHTS = {
    "input_norm": Weight(
        "input_layernorm.weight", lambda d: (d.hidden_size,), "replicated", init="norm"
    ),
    "post_norm": Weight(
        "post_attention_layernorm.weight", lambda d: (d.hidden_size,), "replicated", init="norm"
    ),
    "q": Weight("self_attn.q_proj.weight", lambda d: (_q(d), d.hidden_size), "column"),
    "k": Weight("self_attn.k_proj.weight", lambda d: (_kv(d), d.hidden_size), "column"),
    "v": Weight("self_attn.v_proj.weight", lambda d: (_kv(d), d.hidden_size), "column"),
    "o": Weight(
        "self_attn.o_proj.weight",
        lambda d: (d.hidden_size, _q(d)),
        "row",
        k_field="num_attention_heads",
    ),
    "gate": Weight(
        "mlp.gate_proj.weight", lambda d: (d.intermediate_size, d.hidden_size), "column"
    ),
    "up": Weight("mlp.up_proj.weight", lambda d: (d.intermediate_size, d.hidden_size), "column"),
    "down": Weight(
        "mlp.down_proj.weight",
        lambda d: (d.hidden_size, d.intermediate_size),
        "row",
        k_field="intermediate_size",
    ),
    "q_norm": Weight(
        "self_attn.q_norm.weight",
        lambda d: (d.head_dim,),
        "replicated",
        block="qk_norm",
        init="norm",
    ),
    "k_norm": Weight(
        "self_attn.k_norm.weight",
        lambda d: (d.head_dim,),
        "replicated",
        block="qk_norm",
        init="norm",
    ),
}

MODEL_WEIGHTS = {
    "embed": Weight(
        "model.embed_tokens.weight",
        lambda d: (d.vocab_size, d.hidden_size),
        "vocab",
        init="embedding",
    ),
    "final_norm": Weight(
        "model.norm.weight", lambda d: (d.hidden_size,), "replicated", init="norm"
    ),
    "lm_head": Weight(
        "lm_head.weight",
        lambda d: (d.vocab_size, d.hidden_size),
        "vocab",
        block="untied_head",
        after_layers=True,
    ),
}

# ModelDims field -> HF config.json key (head_dim falls back to hidden_size / heads)
CONFIG_KEYS = {
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "vocab_size": "vocab_size",
    "tie_word_embeddings": "tie_word_embeddings",
    "max_position_embeddings": "max_position_embeddings",
}

ACTIVATIONS = {"silu": "silu_glu"}
