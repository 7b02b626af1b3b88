"""A single-process SGLang-numerics Qwen3 forward composed from the SGLang kernels.

The test oracle: one sequence at a time, no packing, no parallelism, HF weight names, exactly
the op order of SGLang's Qwen3 decoder (residual carried separately, added inside the next norm).
"""

from __future__ import annotations

import torch

from contractgen.adapters.megatron.kernels import kernel_module
from contractgen.adapters.megatron.model import ModelShape


def random_hf_weights(
    shape: ModelShape, seed: int = 0, dtype=torch.bfloat16
) -> dict[str, torch.Tensor]:
    """Random Qwen3 weights in HF naming (what the rollout's default gate uses)."""
    g = torch.Generator().manual_seed(seed)

    def w(*s, scale=0.05):
        return (torch.randn(*s, generator=g) * scale).to(dtype)

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g)).to(dtype)

    h, d = shape.hidden_size, shape.head_dim
    out = {
        "model.embed_tokens.weight": w(shape.vocab_size, h, scale=0.5),
        "model.norm.weight": norm(h),
    }
    if not shape.tie_word_embeddings:
        out["lm_head.weight"] = w(shape.vocab_size, h)
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = w(shape.num_attention_heads * d, h)
        out[p + "self_attn.k_proj.weight"] = w(shape.num_kv_heads * d, h)
        out[p + "self_attn.v_proj.weight"] = w(shape.num_kv_heads * d, h)
        out[p + "self_attn.o_proj.weight"] = w(h, shape.num_attention_heads * d)
        out[p + "self_attn.q_norm.weight"] = norm(d)
        out[p + "self_attn.k_norm.weight"] = norm(d)
        out[p + "input_layernorm.weight"] = norm(h)
        out[p + "post_attention_layernorm.weight"] = norm(h)
        out[p + "mlp.gate_proj.weight"] = w(shape.intermediate_size, h)
        out[p + "mlp.up_proj.weight"] = w(shape.intermediate_size, h)
        out[p + "mlp.down_proj.weight"] = w(h, shape.intermediate_size)
    return out


def reference_logprobs(hf, shape: ModelShape, seq: list[int], kp) -> torch.Tensor:
    """``log p(seq[j+1] | seq[:j+1])`` for one sequence, SGLang op order."""
    k = kernel_module
    lin = k("linear").column_parallel_linear
    norm = k("norm").rms_norm
    add = k("residual").residual_add
    eps = shape.rms_norm_eps
    d, nh, nkv = shape.head_dim, shape.num_attention_heads, shape.num_kv_heads
    ids = torch.tensor(seq)
    pos = torch.arange(len(seq))
    x = hf["model.embed_tokens.weight"][ids]
    residual = None
    cos, sin = k("rope").rope_cos_sin(pos, d, shape.rope_theta, None, kp)
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        if residual is None:
            residual, h = x, norm(x, hf[p + "input_layernorm.weight"], eps, kp)
        else:
            residual = add(x, residual, kp)
            h = norm(residual, hf[p + "input_layernorm.weight"], eps, kp)
        q = lin(h, hf[p + "self_attn.q_proj.weight"], kp).reshape(len(seq), nh, d)
        kk = lin(h, hf[p + "self_attn.k_proj.weight"], kp).reshape(len(seq), nkv, d)
        v = lin(h, hf[p + "self_attn.v_proj.weight"], kp).reshape(len(seq), nkv, d)
        q = norm(q, hf[p + "self_attn.q_norm.weight"], eps, kp)
        kk = norm(kk, hf[p + "self_attn.k_norm.weight"], eps, kp)
        q = k("rope").apply_rope(q, cos, sin, kp)
        kk = k("rope").apply_rope(kk, cos, sin, kp)
        o = k("attention").chunked_attention(q, kk, v, pos, kp, scale=d**-0.5)
        o = lin(o.reshape(len(seq), nh * d), hf[p + "self_attn.o_proj.weight"], kp)
        residual = add(o, residual, kp)
        h = norm(residual, hf[p + "post_attention_layernorm.weight"], eps, kp)
        gate = lin(h, hf[p + "mlp.gate_proj.weight"], kp)
        up = lin(h, hf[p + "mlp.up_proj.weight"], kp)
        x = lin(k("mlp").silu_glu(gate, up, kp), hf[p + "mlp.down_proj.weight"], kp)
    h = norm(add(x, residual, kp), hf["model.norm.weight"], eps, kp)
    head = hf.get("lm_head.weight", hf["model.embed_tokens.weight"])
    logits = lin(h, head, kp)
    return k("logsoftmax").token_logprobs(logits[:-1], ids[1:], kp, shape.vocab_size)
