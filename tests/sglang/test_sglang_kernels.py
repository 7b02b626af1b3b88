"""Bitwise invariances of norm, rope, silu-glu, residual, attention and log-softmax, with twins."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from contractgen.adapters.kernels import all_reduce as ar
from contractgen.adapters.kernels import (
    apply_rope,
    chunked_attention,
    full_logprobs,
    residual_add,
    rms_norm,
    rope_cos_sin,
    silu_glu,
    stock,
    token_logprobs,
    tree_sum,
    vocab_parallel_token_logprobs,
)


def _rand(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


# ---- norm ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("rows,hidden", [(9, 256), (33, 64), (3, 1024)])
def test_rms_norm_row_invariant(kp_dtype, rows, hidden):
    kp, dt = kp_dtype
    x, w = _rand(rows, hidden, dtype=dt), _rand(hidden, dtype=dt, seed=1)
    full = rms_norm(x, w, 1e-6, kp)
    assert full.dtype == dt
    for i in (0, rows - 1):
        assert torch.equal(rms_norm(x[i : i + 1], w, 1e-6, kp)[0], full[i])


def test_rms_norm_cast_order_is_hf_qwen3(kp):
    """bf16: bit-identical to transformers' Qwen3RMSNorm (round before the weight multiply)."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    x = _rand(17, 128, dtype=torch.bfloat16, seed=2, scale=3.0)
    hf = Qwen3RMSNorm(128, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        hf.weight.copy_(_rand(128, seed=3).to(torch.bfloat16))
        assert torch.equal(rms_norm(x, hf.weight, 1e-6, kp), hf(x))


def test_twin_norm_without_cast_before_weight_differs(kp):
    x, w = _rand(64, 128, dtype=torch.bfloat16, seed=4), _rand(128, dtype=torch.bfloat16, seed=5)
    other = dataclasses.replace(kp, norm_cast_before_weight=False)
    assert not torch.equal(rms_norm(x, w, 1e-6, kp), rms_norm(x, w, 1e-6, other))


# ---- rope ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "scaling",
    [
        None,
        (("factor", 2.0), ("rope_type", "linear")),
        (
            ("factor", 8.0),
            ("high_freq_factor", 4.0),
            ("low_freq_factor", 1.0),
            ("original_max_position_embeddings", 64),
            ("rope_type", "llama3"),
        ),
        (("factor", 4.0), ("original_max_position_embeddings", 64), ("rope_type", "yarn")),
    ],
)
def test_rope_position_invariant_and_matches_hf(kp32, scaling):
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d, theta = 64, 10000.0
    pos = torch.arange(300)
    cos, sin = rope_cos_sin(pos, d, theta, scaling, kp32, max_position=256)
    c1, s1 = rope_cos_sin(pos[137:138], d, theta, scaling, kp32, max_position=256)
    assert torch.equal(c1[0], cos[137]) and torch.equal(s1[0], sin[137])
    params = {"rope_type": "default", "rope_theta": theta, **dict(scaling or ())}
    cfg = Qwen3Config(head_dim=d, max_position_embeddings=256, rope_parameters=params)
    kind = params["rope_type"]
    init = ROPE_INIT_FUNCTIONS[kind] if kind != "default" else None
    if init is None:
        inv, att = 1.0 / (theta ** (torch.arange(0, d, 2).float() / d)), 1.0
    else:
        inv, att = init(cfg, "cpu")
    emb = torch.cat([pos.float()[:, None] * inv[None]] * 2, -1)
    torch.testing.assert_close(cos, emb.cos() * att, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sin, emb.sin() * att, rtol=1e-6, atol=1e-6)


def test_rope_unknown_type_is_refused(kp):
    with pytest.raises(ValueError, match="unsupported rope_scaling type 'dynamic'.*supported"):
        rope_cos_sin(torch.arange(4), 64, 1e4, (("factor", 2.0), ("rope_type", "dynamic")), kp)


def test_apply_rope_row_invariant(kp_dtype):
    kp, dt = kp_dtype
    x = _rand(40, 4, 64, dtype=dt)
    cos, sin = rope_cos_sin(torch.arange(40), 64, 1e6, None, kp)
    full = apply_rope(x, cos, sin, kp)
    assert torch.equal(apply_rope(x[7:8], cos[7:8], sin[7:8], kp)[0], full[7])


def test_twin_fused_qk_norm_rope_differs(kp):
    x, w = _rand(32, 4, 64, dtype=torch.bfloat16, seed=6), _rand(64, dtype=torch.bfloat16, seed=7)
    cos, sin = rope_cos_sin(torch.arange(32), 64, 1e6, None, kp)
    contract = apply_rope(rms_norm(x, w, 1e-6, kp), cos, sin, kp)
    assert not torch.equal(contract, stock.fused_qk_norm_rope(x, w, 1e-6, cos, sin, kp))


# ---- mlp / residual ------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 7, 100, 4099])
def test_silu_glu_position_invariant(kp_dtype, n):
    kp, dt = kp_dtype
    g, u = _rand(5000, dtype=dt, scale=4.0), _rand(5000, dtype=dt, seed=1)
    full = silu_glu(g, u, kp)
    for off in (0, 3, 17):
        assert torch.equal(silu_glu(g[off : off + n], u[off : off + n], kp), full[off : off + n])


def test_twin_stock_silu_differs(kp32):
    g, u = _rand(5000, scale=4.0), _rand(5000, seed=1)
    assert not torch.equal(F.silu(g) * u, silu_glu(g, u, kp32))


def test_residual_add_dtype_and_rounding(kp):
    x, r = _rand(8, 32, seed=1), _rand(8, 32, seed=2)
    y = residual_add(x, r, kp)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, x.to(torch.bfloat16) + r.to(torch.bfloat16))


# ---- attention -----------------------------------------------------------------------------------
def _qkv(L, H, KVH, D, dt, seed=0):
    return (
        _rand(L, H, D, dtype=dt, seed=seed),
        _rand(L, KVH, D, dtype=dt, seed=seed + 1),
        _rand(L, KVH, D, dtype=dt, seed=seed + 2),
    )


@pytest.mark.parametrize("S,H,KVH,D", [(150, 4, 2, 32), (64, 2, 1, 64), (97, 6, 3, 16)])
def test_attention_full_prefill_decode_agree(kp_dtype, S, H, KVH, D):
    kp, dt = kp_dtype
    q, k, v = _qkv(S, H, KVH, D, dt)
    full = chunked_attention(q, k, v, torch.arange(S), kp)
    for p in sorted({0, 63, 64, S // 2, S - 1} & set(range(S))):
        dec = chunked_attention(q[p : p + 1], k[: p + 1], v[: p + 1], torch.tensor([p]), kp)
        assert torch.equal(dec[0], full[p]), p
    P = S * 2 // 3  # a prefill of another length
    pre = chunked_attention(q[:P], k[:P], v[:P], torch.arange(P), kp)
    assert torch.equal(pre, full[:P])
    # chunked prefill: second half against the cache of the first
    h = P // 2
    part = chunked_attention(q[h:P], k[:P], v[:P], torch.arange(h, P), kp)
    assert torch.equal(part, full[h:P])


def test_attention_packed_equals_separate(kp_dtype):
    kp, dt = kp_dtype
    (q1, k1, v1), (q2, k2, v2) = _qkv(70, 4, 2, 32, dt, 1), _qkv(9, 4, 2, 32, dt, 5)
    a = chunked_attention(q1, k1, v1, torch.arange(70), kp)
    b = chunked_attention(q2, k2, v2, torch.arange(9), kp)
    packed = chunked_attention(
        torch.cat([q1, q2]),
        torch.cat([k1, k2]),
        torch.cat([v1, v2]),
        torch.cat([torch.arange(70), torch.arange(9)]),
        kp,
        cu_seqlens_q=torch.tensor([0, 70, 79]),
        cu_seqlens_k=torch.tensor([0, 70, 79]),
    )
    assert torch.equal(packed, torch.cat([a, b]))


def test_attention_matches_float64_reference(kp32):
    q, k, v = _qkv(90, 4, 2, 32, torch.float64, 3)
    s = torch.einsum("lhd,shd->hls", q, k.repeat_interleave(2, 1)) / math.sqrt(32)
    s = s.masked_fill(torch.triu(torch.ones(90, 90, dtype=torch.bool), 1), -math.inf)
    ref = torch.einsum("hls,shd->lhd", s.softmax(-1), v.repeat_interleave(2, 1))
    got = chunked_attention(q.float(), k.float(), v.float(), torch.arange(90), kp32)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)


def test_twin_other_kv_chunk_differs(kp32):
    q, k, v = _qkv(150, 4, 2, 32, torch.float32, 9)
    a = chunked_attention(q, k, v, torch.arange(150), kp32)
    assert not torch.equal(
        a, stock.other_chunk_attention(q, k, v, torch.arange(150), kp32, kv_chunk=16)
    )


def test_twin_sdpa_prefill_vs_decode_differs(kp32):
    for seed in range(10):
        q, k, v = _qkv(200, 4, 2, 64, torch.float32, seed)
        full = stock.sdpa_attention(q, k, v, torch.arange(200), kp32)
        for p in (63, 120, 199):
            dec = stock.sdpa_attention(
                q[p : p + 1], k[: p + 1], v[: p + 1], torch.tensor([p]), kp32
            )
            if not torch.equal(dec[0], full[p]):
                return
    pytest.fail("SDPA gave identical bits for decode and full forward on every input")


# ---- log-softmax ---------------------------------------------------------------------------------
@pytest.mark.parametrize("T,V,Vpad", [(5, 1000, 1024), (12, 128, 128), (3, 3001, 3072)])
def test_token_logprobs_row_invariant_and_trims_padding(kp_dtype, T, V, Vpad):
    kp, _ = kp_dtype
    logits = _rand(T, Vpad, scale=3.0)
    logits[:, V:] = 50.0  # padded columns must not count
    ids = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(1))
    lp = token_logprobs(logits, ids, kp, V)
    assert lp.dtype == getattr(torch, kp.logsoftmax_dtype)
    for t in (0, T - 1):
        assert torch.equal(token_logprobs(logits[t : t + 1], ids[t : t + 1], kp, V)[0], lp[t])
    assert torch.equal(full_logprobs(logits, kp, V).gather(1, ids[:, None])[:, 0], lp)
    ref = torch.log_softmax(logits[:, :V].to(getattr(torch, kp.logsoftmax_dtype)).double(), -1)
    torch.testing.assert_close(lp.double(), ref.gather(1, ids[:, None])[:, 0], rtol=1e-2, atol=1e-5)


def test_token_logprobs_single_rank_vocab_parallel_form(kp):
    logits, ids = _rand(6, 1000, scale=3.0), torch.arange(6) * 150
    assert torch.equal(
        vocab_parallel_token_logprobs(logits, ids, 0, 1000, kp),
        token_logprobs(logits, ids, kp, 1000),
    )


def test_twin_logsoftmax_other_dtype_differs(kp):
    """The public bug: fp32 log-softmax where the contract (v1) says bf16, and vice versa."""
    logits, ids = _rand(32, 1000, scale=3.0, seed=3), torch.arange(32) * 31
    v1 = token_logprobs(logits, ids, kp, 1000)
    assert not torch.equal(v1.float(), stock.stock_token_logprobs(logits, ids, kp, 1000))
    v2 = token_logprobs(logits, ids, dataclasses.replace(kp, logsoftmax_dtype="float32"), 1000)
    assert v2.dtype == torch.float32 and not torch.equal(v1.float(), v2)


# ---- all-reduce order (local) --------------------------------------------------------------------
def test_tree_sum_order_and_non_power_of_two_refused(monkeypatch):
    a, b, c, d = (_rand(64, dtype=torch.bfloat16, seed=s) for s in range(4))
    assert torch.equal(tree_sum([a, b, c, d]), (a + b) + (c + d))
    monkeypatch.setattr(ar, "world_size", lambda group=None: 3)
    with pytest.raises(ValueError, match="group size 3 is not a power of two"):
        ar.tree_all_reduce(a)
