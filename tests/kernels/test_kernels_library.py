"""One kernel library: the registry, the old import paths, and the bounded-memory reference whose
bits equal the previous (expanded) formulation."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from contractgen.adapters import kernels as K
from contractgen.adapters.kernels import attention, logsoftmax, matmul, norm, registry


def _r(*shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def test_registry_picks_the_reference_on_cpu(monkeypatch):
    monkeypatch.delenv(registry.ENV, raising=False)
    assert registry.backend_for("cpu") == "torch"
    assert registry.kernel("invariant_matmul", "cpu") is matmul.reference_matmul
    assert registry.kernel("chunked_attention", "cpu") is attention.reference_attention
    assert registry.kernel("attention_backward", "cpu") is attention.reference_attention_backward
    assert registry.kernel("rms_norm", "cpu") is norm.reference_rms_norm


def test_registry_names_the_valid_choices(monkeypatch):
    monkeypatch.setenv(registry.ENV, "cutlass")
    with pytest.raises(
        ValueError, match=r"CONTRACTGEN_KERNEL_BACKEND='cutlass'.*\['torch', 'triton'\]"
    ):
        registry.backend_for("cpu")
    monkeypatch.delenv(registry.ENV)
    with pytest.raises(ValueError, match="kernel op 'softmax' has no 'torch' backend"):
        registry.kernel("softmax", "cpu")


def test_layers_reach_the_kernels_by_import_only():
    """One way from a layer to its kernel: no alias package, no module looked up by a string."""
    import importlib.util
    from pathlib import Path

    assert importlib.util.find_spec("contractgen.adapters.sglang.kernels") is None
    adapters = Path(K.__file__).parent.parent
    lookups = [
        f"{p.relative_to(adapters)}:{n}"
        for target in ("megatron", "sglang", "fsdp")
        for p in sorted((adapters / target).glob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "kernel_module(" in line or ("import_module(" in line and "kernels" in line)
    ]
    assert lookups == []


def _expanded_partials(x_MK, w_NK, k_block, acc):
    """The formulation used until 2026-11-30: every GEMM a fixed 64 x k_block x 64 block on
    operands expanded to M*N*K/64 elements."""
    M, Kd = x_MK.shape
    N = w_NK.shape[0]
    T = math.ceil(Kd / k_block)
    Mp, Np = math.ceil(M / 64) * 64, math.ceil(N / 64) * 64
    w32 = F.pad(w_NK.float(), (0, T * k_block - Kd, 0, Np - N))
    w_t = w32.view(Np // 64, 64, T, k_block).permute(2, 0, 3, 1)
    x32 = F.pad(x_MK.float(), (0, T * k_block - Kd, 0, Mp - M))
    x_t = x32.view(Mp // 64, 64, T, k_block).permute(2, 0, 1, 3)
    nM, nN = Mp // 64, Np // 64
    a = x_t.unsqueeze(2).expand(T, nM, nN, 64, k_block).reshape(-1, 64, k_block)
    b = w_t.unsqueeze(1).expand(T, nM, nN, k_block, 64).reshape(-1, k_block, 64)
    p = torch.bmm(a, b).view(T, nM, nN, 64, 64).permute(0, 1, 3, 2, 4)
    return p.reshape(T, Mp, Np)[:, :M, :N].to(acc)


@pytest.mark.parametrize("m,k,n", [(1, 256, 96), (70, 640, 200), (130, 4864, 64)])
@pytest.mark.parametrize("order", ["sglang_first_level", "binary"])
def test_streamed_matmul_keeps_the_expanded_bits(kp, m, k, n, order):
    x, w = _r(m, k), _r(n, k, seed=1)
    old = matmul.combine_tiles(list(_expanded_partials(x, w, 128, torch.bfloat16)), order)
    assert torch.equal(K.invariant_matmul(x, w, kp, tile_order=order), old.to(torch.bfloat16))


def test_no_weight_copy_outlives_a_call(kp):
    w = _r(64, 256)
    K.invariant_matmul(_r(3, 256), w, kp)
    assert not hasattr(w, "_contractgen_tiles")


def test_attention_query_blocks_do_not_change_bits(kp, monkeypatch):
    L, H, KVH, D = 90, 4, 2, 16
    q, k, v = _r(L, H, D), _r(L, KVH, D, seed=1), _r(L, KVH, D, seed=2)
    whole = K.chunked_attention(q, k, v, torch.arange(L), kp)
    monkeypatch.setattr(attention, "_BLOCK_ELEMENTS", H * kp.attention_kv_chunk * D * 7)
    assert torch.equal(K.chunked_attention(q, k, v, torch.arange(L), kp), whole)
    assert torch.equal(K.chunked_attention(q[-1:], k, v, torch.tensor([L - 1]), kp)[0], whole[-1])


def test_logprob_row_blocks_and_fused_lm_head_keep_bits(kp, monkeypatch):
    T, Hd, V = 40, 128, 1000
    h, w = _r(T, Hd), _r(V, Hd, seed=1)
    ids = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(3))
    logits = K.invariant_matmul(h, w, kp)
    whole = K.token_logprobs(logits, ids, kp, V)
    monkeypatch.setattr(logsoftmax, "_BLOCK_ELEMENTS", V * 6)
    assert torch.equal(K.token_logprobs(logits, ids, kp, V), whole)
    assert torch.equal(logsoftmax.lm_head_token_logprobs(h, w, ids, kp, V), whole)


def _dense_packed_attention(q, k, v, cu, scale):
    """float64 masked-softmax attention per packed sequence (GQA by repeat), differentiable."""
    rep, outs = q.shape[1] // k.shape[1], []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        n = b - a
        s = torch.einsum("thd,shd->hts", q[a:b], k[a:b].repeat_interleave(rep, 1)) * scale
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril()[None], -math.inf)
        outs.append(torch.einsum("hts,shd->thd", s.softmax(-1), v[a:b].repeat_interleave(rep, 1)))
    return torch.cat(outs)


def test_attention_lse_is_the_forward_and_its_log_normaliser(kp):
    L, H, KVH, D = 70, 4, 2, 16
    q, k, v = _r(L, H, D), _r(L, KVH, D, seed=1), _r(L, KVH, D, seed=2)
    pos = torch.arange(L)
    o, lse = K.chunked_attention_lse(q, k, v, pos, kp)
    assert torch.equal(o, K.chunked_attention(q, k, v, pos, kp))
    s = torch.einsum("thd,shd->hts", q.double(), k.double().repeat_interleave(2, 1)) * D**-0.5
    want = torch.logsumexp(s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), -math.inf), -1)
    torch.testing.assert_close(lse.double(), want.T, rtol=0, atol=1e-5)


@pytest.mark.parametrize("block", [None, 7], ids=["one-block", "query-blocks"])
def test_attention_backward_matches_float64_autograd(kp, monkeypatch, block):
    """The saved-output backward (packed, GQA, a one-token sequence) equals float64 autograd of a
    dense masked softmax, whatever the query blocking."""
    lens, H, KVH, D = [5, 70, 1], 4, 2, 16
    L, cu = sum(lens), torch.tensor([0, 5, 75, 76])
    pos = torch.cat([torch.arange(n) for n in lens])
    q, k, v = (_r(L, h, D, dtype=torch.float64, seed=i) for i, h in enumerate((H, KVH, KVH)))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = _dense_packed_attention(*leaves, cu, D**-0.5)
    d_out = _r(L, H, D, dtype=torch.float64, seed=9)
    want = torch.autograd.grad(out, leaves, d_out)
    if block:
        monkeypatch.setattr(attention, "_BLOCK_ELEMENTS", H * L * block)
    kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu)
    o, lse = K.chunked_attention_lse(q, k, v, pos, kp, **kw)
    got = K.attention_backward(q, k, v, o, lse, d_out, pos, kp, **kw)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float64
        torch.testing.assert_close(g, w, rtol=0, atol=2e-6 * w.abs().max())  # fp32 softmax


def test_attention_backward_of_a_query_suffix(kp):
    """Queries ``p0..`` of a sequence against all its keys (the trainer's owned rows of a path):
    the rows' gradients of the whole sequence, and keys after the last query get none."""
    L, H, KVH, D, p0 = 40, 2, 1, 16, 25
    q, k, v = (_r(L, h, D, dtype=torch.float64, seed=i) for i, h in enumerate((H, KVH, KVH)))
    pos = torch.arange(L)
    o, lse = K.chunked_attention_lse(q, k, v, pos, kp)
    d_out = _r(L, H, D, dtype=torch.float64, seed=9)
    d_out[:p0] = 0
    whole = K.attention_backward(q, k, v, o, lse, d_out, pos, kp)
    part = K.attention_backward(q[p0:30], k[:30], v[:30], o[p0:30], lse[p0:30], d_out[p0:30],
                                pos[p0:30], kp)  # fmt: skip
    torch.testing.assert_close(part[0], whole[0][p0:30], rtol=0, atol=1e-12)
    d_out[30:] = 0
    whole = K.attention_backward(q, k, v, o, lse, d_out, pos, kp)
    for g, w in zip(part[1:], whole[1:], strict=True):
        torch.testing.assert_close(g, w[:30], rtol=0, atol=1e-12)
        assert not w[30:].any()


@pytest.mark.parametrize("x_dtype", [torch.float64, torch.bfloat16], ids=["fp64", "bf16"])
@pytest.mark.parametrize("cast_before_weight", [True, False], ids=["cast-first", "product"])
def test_rms_norm_analytic_backward_matches_float64(kp, x_dtype, cast_before_weight):
    """The norm's backward (``rms_norm_backward`` from the saved 1/rms) against float64 autograd
    of the plain formula; the forward under autograd keeps the no-grad forward's bits."""
    kp = dataclasses.replace(kp, norm_cast_before_weight=cast_before_weight)
    x = (_r(3, 5, 100, dtype=torch.float64, seed=1) * 3).to(x_dtype).requires_grad_()
    w = (_r(100, dtype=torch.float64, seed=2).abs() + 0.5).to(x_dtype).requires_grad_()
    dy = _r(3, 5, 100, dtype=torch.float64, seed=3).to(x_dtype)
    y = K.rms_norm(x, w, 1e-6, kp)
    with torch.no_grad():
        assert torch.equal(K.rms_norm(x, w, 1e-6, kp), y)
    got = torch.autograd.grad(y, (x, w), dy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = w64 * x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + 1e-6)
    want = torch.autograd.grad(y64, (x64, w64), dy.double())
    tol = 2e-2 if x_dtype == torch.bfloat16 else 1e-5
    for a, b in zip(got, want, strict=True):
        assert a.dtype == x_dtype
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol * b.abs().max().item())


@pytest.mark.parametrize(
    "m,n,limit",
    [
        (70, 200, 64 * 128),  # column panels of 64, the last one 8 wide and zero padded
        (130, 300, 64 * 64 * 2),  # rows x 64 > limit: row panels of 64 then column panels
        (1, 4096, 64 * 1000),  # one row: panels of 960 columns
        (200, 96, 10**9),  # under the limit: one panel (the unpanelled path)
    ],
)
@pytest.mark.parametrize("order", ["sglang_first_level", "binary"])
@pytest.mark.parametrize("out", [None, torch.bfloat16])
def test_streamed_matmul_panels_keep_bits(m, n, limit, order, out):
    """Output panels (whole 64 x 64 blocks, the full K loop each) give each element the same
    bits as one panel, across panel boundaries, for both tile orders and a cast output."""
    x, w = _r(m, 640, dtype=torch.float32), _r(n, 640, seed=1, dtype=torch.float32)
    x, w = x.to(torch.bfloat16), w.to(torch.bfloat16)
    whole = matmul.streamed_matmul(x, w, 128, torch.float32, order, panel_elements=10**12)
    whole = whole if out is None else whole.to(out)
    panels = matmul._panels(m, n, limit)
    assert (len(panels) > 1) == (m * n > limit)
    got = matmul.streamed_matmul(x, w, 128, torch.float32, order, out_dtype=out,
                                 panel_elements=limit)  # fmt: skip
    assert got.dtype == (out or torch.float32)
    assert torch.equal(got, whole)


def test_panels_cover_the_output_once_in_whole_blocks():
    for m, n, limit in [(70, 200, 64 * 128), (130, 300, 8192), (1024, 151936, 1 << 22)]:
        seen = torch.zeros(m, n, dtype=torch.int32)
        for m0, m1, n0, n1 in matmul._panels(m, n, limit):
            assert m0 % matmul.M_TILE == 0 and n0 % matmul.N_TILE == 0
            assert (m1 - m0) * (n1 - n0) <= max(limit, matmul.M_TILE * matmul.N_TILE)
            seen[m0:m1, n0:n1] += 1
        assert bool((seen == 1).all())


def test_vocab_parallel_logprob_row_blocks_keep_bits(kp, monkeypatch):
    T, V = 37, 1000
    logits = _r(T, 1024)  # a padded shard: columns past V are dropped
    ids = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(3))
    whole = logsoftmax.vocab_parallel_token_logprobs(logits, ids, 0, V, kp)
    assert torch.equal(whole, K.token_logprobs(logits, ids, kp, V))
    monkeypatch.setattr(logsoftmax, "_BLOCK_ELEMENTS", 1024 * 5)  # 5 rows a block, 8 blocks
    assert torch.equal(logsoftmax.vocab_parallel_token_logprobs(logits, ids, 0, V, kp), whole)
    x = logits.float().requires_grad_()  # differentiable through the blocks
    g_whole = torch.autograd.grad(
        logsoftmax._vocab_parallel_token_logprobs(x, ids, 0, V, kp, None).float().sum(), x
    )[0]
    g_blocks = torch.autograd.grad(
        logsoftmax.vocab_parallel_token_logprobs(x, ids, 0, V, kp).float().sum(), x
    )[0]
    assert torch.equal(g_blocks, g_whole)
