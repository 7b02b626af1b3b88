"""Per layer class: forward bit-identical to the SGLang kernels, a twin with one flipped policy
field that is not, and backward against float64 autograd (in-process, one gloo rank)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from megatron_testing import single_process_megatron

from contractgen.adapters import kernels as K
from contractgen.adapters.common.packing import pack_sequences
from contractgen.adapters.common.policy import float32_kernel_policy
from contractgen.adapters.megatron import attention as attn_mod
from contractgen.adapters.megatron import layers as L
from contractgen.adapters.megatron.model import Layout, make_config
from contractgen.adapters.megatron.packing import thd_params
from contractgen.adapters.megatron.policy import generated

V1 = "qwen3_dense_true_on_policy_v1"


@pytest.fixture(scope="module", autouse=True)
def megatron_world():
    with single_process_megatron():
        yield


def _kp():
    return generated().schema.kernel_policy_for(V1)


def _config(arch, *, kp=None, **runtime_changes):
    return make_config(V1, arch, Layout(), kernel_policy=kp, runtime_changes=runtime_changes)


def _rand(*shape, seed, dtype=torch.bfloat16, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _init(module, seed):
    with torch.no_grad():
        for i, p in enumerate(module.parameters()):
            p.copy_(_rand(*p.shape, seed=seed + i, dtype=p.dtype, scale=0.05) + (p.dim() == 1))
    return module


def _column(config, n_in, n_out, seed=1):
    return _init(
        L.SGLangColumnParallelLinear(
            n_in,
            n_out,
            config=config,
            init_method=config.init_method,
            bias=False,
            gather_output=False,
        ),
        seed,
    )


def _row(config, n_in, n_out, seed=2):
    return _init(
        L.SGLangRowParallelLinear(
            n_in,
            n_out,
            config=config,
            init_method=config.output_layer_init_method,
            bias=False,
            input_is_parallel=True,
            skip_bias_add=True,
        ),
        seed,
    )


# ------------------------------------------------------------------ forward: bitwise + twin


def test_column_parallel_linear_bitwise_and_twin(arch):
    kp = _kp()
    x = _rand(37, arch.hidden_size, seed=3)
    lin = _column(_config(arch), arch.hidden_size, 512)
    with torch.no_grad():
        out, _ = lin(x)
    assert torch.equal(out, K.column_parallel_linear(x, lin.weight, kp))
    twin = _column(_config(arch, batch_invariant_mode=False), arch.hidden_size, 512)
    with torch.no_grad():
        assert not torch.equal(twin(x)[0], out)


def test_row_parallel_linear_bitwise_and_twin(arch):
    kp = _kp()
    k = arch.intermediate_size  # 768: 6 tiles of 128, SGLang's first level = runs of 3
    x = _rand(21, k, seed=4)
    row = _row(_config(arch), k, arch.hidden_size)
    with torch.no_grad():
        out, _ = row(x)
    assert torch.equal(out, K.row_parallel_linear(x, row.weight, kp, None))
    binary = dataclasses.replace(kp, matmul_tile_order="binary")
    twin = _row(_config(arch, kp=binary), k, arch.hidden_size)
    with torch.no_grad():
        assert not torch.equal(twin(x)[0], out)


def test_norms_bitwise_and_twin(arch):
    kp = _kp()
    config = _config(arch)
    x = _rand(19, arch.hidden_size, seed=5, scale=3.0)
    norm = _init(L.SGLangNorm(config, arch.hidden_size, eps=arch.norm_eps), 6)
    with torch.no_grad():
        assert torch.equal(norm(x), K.rms_norm(x, norm.weight, arch.norm_eps, kp))

    q = _rand(19, arch.num_attention_heads, arch.head_dim, seed=7, scale=3.0)
    qk = _init(L.SGLangQKRMSNorm(config, arch.head_dim, eps=arch.norm_eps), 8)
    twin = L.SGLangQKRMSNorm(
        _config(arch, cast_qk_norm_input_before_weight_mul=False), arch.head_dim, eps=arch.norm_eps
    )
    twin.load_state_dict(qk.state_dict())
    with torch.no_grad():
        assert torch.equal(qk(q), K.rms_norm(q, qk.weight, arch.norm_eps, kp))
        assert not torch.equal(twin(q), qk(q))


def test_final_norm_consumes_residual_pair_bitwise_and_twin(arch):
    kp = _kp()
    h = arch.hidden_size
    out, residual = _rand(23, h, seed=9), _rand(23, h, seed=10, scale=4.0)
    carrier = L.join_carrier(out, residual)
    assert carrier.shape[-1] == 2 * h and torch.equal(L.split_carrier(carrier, h)[1], residual)
    cls = L.FINAL_NORM_BY_USE_SGLANG_FINAL_NORM[True]
    final = _init(cls(_config(arch), h, eps=arch.norm_eps), 11)
    want = K.rms_norm(K.residual_add(out, residual, kp), final.weight, arch.norm_eps, kp)
    with torch.no_grad():
        assert torch.equal(final(carrier), want)
        stock = L.FINAL_NORM_BY_USE_SGLANG_FINAL_NORM[False](_config(arch), h, eps=arch.norm_eps)
        stock.load_state_dict(final.state_dict())
        assert not torch.equal(stock(carrier), want)


def test_mlp_swiglu_bitwise_and_twin(arch):
    kp = _kp()
    gate, up = _rand(29, 512, seed=12, scale=2.0), _rand(29, 512, seed=13, scale=2.0)
    fc1 = torch.cat([gate, up], dim=-1)
    want = K.silu_glu(gate, up, kp)
    assert torch.equal(L.SWIGLU_BY_DISABLE_BIAS_SWIGLU_FUSION[True](fc1, kp), want)
    assert not torch.equal(L.SWIGLU_BY_DISABLE_BIAS_SWIGLU_FUSION[False](fc1, kp), want)


def _core_attention(config):
    from megatron.core.transformer.enums import AttnMaskType

    return attn_mod.SGLangCoreAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal)


def _qkv(arch, t, seed, dtype=torch.bfloat16):
    return (
        _rand(t, arch.num_attention_heads, arch.head_dim, seed=seed, dtype=dtype),
        _rand(t, arch.num_kv_heads, arch.head_dim, seed=seed + 1, dtype=dtype),
        _rand(t, arch.num_kv_heads, arch.head_dim, seed=seed + 2, dtype=dtype),
    )


def test_core_attention_packed_bitwise_and_twin(arch):
    """Two sequences packed in one row == each sequence alone through RoPE + chunked attention."""
    kp = _kp()
    pack = pack_sequences([list(range(70)), list(range(9))])
    params = thd_params(pack)
    q, k, v = _qkv(arch, 79, seed=14)
    core = _core_attention(_config(arch))
    with torch.no_grad():
        got = core(q, k, v, None, packed_seq_params=params)
    for path in pack.paths:
        pos = pack.positions[path]
        cos, sin = K.rope_cos_sin(pos, arch.head_dim, arch.rope_theta, None, kp)
        qr, kr = K.apply_rope(q[path], cos, sin, kp), K.apply_rope(k[path], cos, sin, kp)
        want = K.chunked_attention(qr, kr, v[path], pos, kp)
        assert torch.equal(got[path], want.reshape(len(path), -1))
    twin = _core_attention(_config(arch, cast_qk_after_rope_to_dense_math_dtype=False))
    with torch.no_grad():
        assert not torch.equal(twin(q, k, v, None, packed_seq_params=params), got)


# ------------------------------------------------------------------ backward vs float64


def _fp32_config(arch, **changes):
    return _config(arch, kp=float32_kernel_policy(_kp()), **changes)


def _close(a, b):
    torch.testing.assert_close(a.double(), b.double(), rtol=2e-4, atol=2e-5)


def _grads(fn, *tensors):
    leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
    out = fn(*leaves)
    g = _rand(*out.shape, seed=99, dtype=out.dtype)
    (out * g).sum().backward()
    return out, [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("which", ["column", "row"])
def test_linear_backward_matches_float64(arch, which):
    config = _fp32_config(arch)
    n_in, n_out = (arch.hidden_size, 384) if which == "column" else (384, arch.hidden_size)
    lin = (_column if which == "column" else _row)(config, n_in, n_out)
    x = _rand(13, n_in, seed=15, dtype=torch.float32)
    w = lin.weight.detach()
    x_leaf = x.clone().requires_grad_(True)
    out, _ = lin(x_leaf)
    g = _rand(*out.shape, seed=99, dtype=out.dtype)
    (out * g).sum().backward()
    x64, w64 = x.double().requires_grad_(True), w.double().requires_grad_(True)
    ((x64 @ w64.T) * g.double()).sum().backward()
    _close(x_leaf.grad, x64.grad)
    _close(lin.weight.grad, w64.grad)


def _rms64(x, w, eps):
    return w * x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("cls", [L.SGLangNorm, L.SGLangQKRMSNorm, L.SGLangFinalRMSNorm])
def test_norm_backward_matches_float64(arch, cls):
    h = arch.hidden_size
    norm = _init(cls(_fp32_config(arch), h, eps=arch.norm_eps), 16)
    w = norm.weight.detach().double()
    if cls is L.SGLangFinalRMSNorm:
        a, b = (
            _rand(11, h, seed=17, dtype=torch.float32),
            _rand(11, h, seed=18, dtype=torch.float32),
        )
        _, (ga, gb) = _grads(lambda x, y: norm(L.join_carrier(x, y)), a, b)
        _, (ra, rb) = _grads(lambda x, y: _rms64(x + y, w, arch.norm_eps), a.double(), b.double())
        _close(ga, ra)
        _close(gb, rb)
    else:
        x = _rand(11, h, seed=19, dtype=torch.float32)
        _, (gx,) = _grads(norm, x)
        _, (rx,) = _grads(lambda t: _rms64(t, w, arch.norm_eps), x.double())
        _close(gx, rx)


def _visibility_mask(params, total: int) -> torch.Tensor:
    """``[T, T]`` bool over the whole pack: row ``i`` may attend key row ``j`` (the oracle the
    per-path gradient path must agree with)."""
    mask = torch.zeros(total, total, dtype=torch.bool)
    for path, owned in zip(params.paths, params.owned, strict=True):
        n = path.numel()
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
        mask[path[owned][:, None], path[None, :]] = causal[owned]
    return mask


@pytest.mark.parametrize(
    "sequences,prompt_lens",
    [
        ([list(range(20)), list(range(7))], None),
        # a shared 6-token prompt stored once (prefix tree): its rows feed both paths' keys
        ([list(range(6)) + [30, 31, 32], list(range(6)) + [40, 41], list(range(8))], [6, 6, 3]),
    ],
    ids=["two-paths", "prefix-tree"],
)
def test_core_attention_backward_matches_float64(arch, sequences, prompt_lens):
    kp32 = float32_kernel_policy(_kp())
    pack = pack_sequences(sequences, prompt_lens=prompt_lens, prefix_tree=prompt_lens is not None)
    params = thd_params(pack)
    total = pack.token_ids.numel()
    q, k, v = _qkv(arch, total, seed=20, dtype=torch.float32)
    core = _core_attention(_fp32_config(arch))
    _, got = _grads(lambda a, b, c: core(a, b, c, None, packed_seq_params=params), q, k, v)

    cos, sin = K.rope_cos_sin(pack.positions, arch.head_dim, arch.rope_theta, None, kp32)
    cos, sin = cos.double(), sin.double()

    def rope64(x):
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos[:, None] + rot * sin[:, None]

    mask = _visibility_mask(params, total)

    def ref(a, b, c):
        rep = a.shape[1] // b.shape[1]
        qa, kb = rope64(a), rope64(b).repeat_interleave(rep, 1)
        s = torch.einsum("thd,shd->hts", qa, kb) * arch.head_dim**-0.5
        p = torch.softmax(s.masked_fill(~mask[None], float("-inf")), -1)
        o = torch.einsum("hts,shd->thd", p, c.repeat_interleave(rep, 1))
        return o.reshape(o.shape[0], -1)

    _, want = _grads(ref, q.double(), k.double(), v.double())
    for a, b in zip(got, want, strict=True):
        _close(a, b)


def test_core_attention_flat_pack_is_one_call_with_per_path_bits_and_grads(arch):
    """A pack without a shared prefix runs attention as one varlen call (``flat``); its output
    is bitwise the per-path calls' and its gradients theirs (a prefix-tree pack is not flat)."""
    pack = pack_sequences([list(range(70)), list(range(9)), list(range(33))])
    params = thd_params(pack)
    assert params.flat
    # the offsets the kernels read stay on the host wherever the params go
    moved = params.to("meta")
    assert moved.cu_seqlens_q.is_meta and not moved.cu_seqlens_host.is_meta
    assert torch.equal(moved.cu_seqlens_host, params.cu_seqlens_q)
    assert attn_mod._kernel_calls(moved)[0][2] is moved.cu_seqlens_host
    tree = pack_sequences([[1, 2, 3, 4], [1, 2, 5]], prompt_lens=[2, 2], prefix_tree=True)
    assert not thd_params(tree).flat
    per_path = dataclasses.replace(params, flat=False)
    q, k, v = _qkv(arch, pack.token_ids.numel(), seed=23, dtype=torch.float32)
    core = _core_attention(_fp32_config(arch))
    out, grads = _grads(lambda a, b, c: core(a, b, c, None, packed_seq_params=params), q, k, v)
    out_p, grads_p = _grads(
        lambda a, b, c: core(a, b, c, None, packed_seq_params=per_path), q, k, v
    )
    assert torch.equal(out, out_p)
    for a, b in zip(grads, grads_p, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6 * b.abs().max())


def test_mlp_activation_backward_matches_float64():
    kp32 = float32_kernel_policy(_kp())
    fc1 = _rand(9, 64, seed=21, dtype=torch.float32, scale=2.0)
    _, (g,) = _grads(lambda t: L.SWIGLU_BY_DISABLE_BIAS_SWIGLU_FUSION[True](t, kp32), fc1)

    def ref(t):
        a, b = t.chunk(2, dim=-1)
        return F.silu(a) * b

    _, (r,) = _grads(ref, fc1.double())
    _close(g, r)


class _RecordingCtx:
    """Stands in for autograd's ctx: records what a Function's forward leaves for backward."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def test_kernel_value_linear_builds_the_context_megatron_linear_builds():
    """KernelValueLinear sets the fields megatron-core's linear forward sets and nothing less: a
    megatron version whose backward reads a new field fails here, not in a training run."""
    from megatron.core.tensor_parallel.layers import (
        LinearWithGradAccumulationAndAsyncCommunication as MegatronLinear,
    )

    from contractgen.adapters.megatron.autograd import LINEAR_CTX_FIELDS, KernelValueLinear

    x, w = _rand(3, 8, seed=40), _rand(5, 8, seed=41)
    args = (x, w, None, False, False, False, None, None, None)
    theirs, ours = _RecordingCtx(), _RecordingCtx()
    MegatronLinear.forward(theirs, *args)
    value = KernelValueLinear.forward(ours, lambda: torch.zeros(3, 5, dtype=x.dtype), *args)
    assert set(vars(theirs)) - {"saved_tensors"} <= set(vars(ours))
    assert set(LINEAR_CTX_FIELDS) <= set(vars(theirs))
    assert all(a is b for a, b in zip(theirs.saved_tensors, ours.saved_tensors, strict=True))
    assert torch.equal(value, torch.zeros(3, 5, dtype=x.dtype))  # the kernel's value, no GEMM


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_value_linear_forward_is_the_kernel_backward_is_megatrons(dtype):
    """Forward: the kernel's bits. Backward: bit for bit what megatron-core's own linear gives
    for the same output gradient (dX = dY W, dW = dYᵀ X)."""
    from megatron.core.tensor_parallel.layers import (
        linear_with_grad_accumulation_and_async_allreduce,
    )

    from contractgen.adapters.megatron.autograd import kernel_value_linear

    kp = _kp() if dtype == torch.bfloat16 else float32_kernel_policy(_kp())
    x0, w0 = _rand(7, 256, seed=42, dtype=dtype), _rand(24, 256, seed=43, dtype=dtype)
    dy = _rand(7, 24, seed=44, dtype=dtype)
    kernel = K.invariant_matmul(x0, w0, kp)

    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    out = kernel_value_linear(lambda: K.invariant_matmul(x.detach(), w.detach(), kp), x, w)
    assert torch.equal(out, kernel)
    out.backward(dy)

    xm, wm = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    ref = linear_with_grad_accumulation_and_async_allreduce(xm, wm, None, False, False, False)
    ref.backward(dy)
    assert torch.equal(x.grad, xm.grad) and torch.equal(w.grad, wm.grad)
