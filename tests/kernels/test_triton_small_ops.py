"""The decode step's small ops in one Triton kernel each (RMSNorm, RoPE, SiLU-GLU): the same bits
as the PyTorch reference (their contract) and each row's bits independent of the batch.

On a CUDA device these run the compiled kernels (``gpu``) against the reference on the same
device, bit for bit. Without one, Triton's interpreter runs them on CPU against the CPU reference:
bit for bit too, except SiLU-GLU in float32, whose ``exp`` is numpy's there (the interpreter has no
libdevice) and may differ from torch's CPU ``exp`` in the last bit; in bf16 the rounding hides it.
Each test has a twin that shows it can fail: the stock op it replaces gives other bits.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
pytest.importorskip("triton")

from contractgen.adapters.kernels import registry  # noqa: E402
from contractgen.adapters.kernels.mlp import reference_silu_glu  # noqa: E402
from contractgen.adapters.kernels.norm import reference_rms_norm  # noqa: E402
from contractgen.adapters.kernels.rope import reference_apply_rope, rope_cos_sin  # noqa: E402
from contractgen.adapters.kernels.triton import mlp as tmlp  # noqa: E402
from contractgen.adapters.kernels.triton import norm as tnorm  # noqa: E402
from contractgen.adapters.kernels.triton import rope as trope  # noqa: E402

pytestmark = [pytest.mark.gpu] if CUDA else []
DEV = "cuda" if CUDA else "cpu"
BF = torch.bfloat16


def _randn(*shape, seed: int, scale: float = 3.0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEV)


def test_the_triton_backend_names_the_one_kernel_small_ops():
    for op, fn in (("rms_norm", "triton_rms_norm"), ("apply_rope", "triton_apply_rope"),
                   ("silu_glu", "triton_silu_glu")):  # fmt: skip
        assert registry.BACKENDS["triton"][op].endswith(f":{fn}")
        assert registry.BACKENDS["torch"][op].split(":")[1].startswith("reference_")


@pytest.mark.parametrize("n", [1024, 128, 2560, 100])
@pytest.mark.parametrize("dtype", [BF, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("cast_before_weight", [True, False], ids=["cast-first", "product"])
def test_rms_norm_is_the_references_bits_and_row_invariant(kp, n, dtype, cast_before_weight):
    kp = dataclasses.replace(kp, norm_cast_before_weight=cast_before_weight)
    # 37 rows: several programs of several rows each at the narrow widths; at 2560 (padded to
    # 4096 > ELEMENTS) a program takes one row, so 9 rows are 9 programs (CI time: the interpreter)
    rows = 37 if n <= 1024 else 9
    x = _randn(rows, n, seed=n, dtype=dtype)
    w = (_randn(n, seed=n + 1, scale=0.2) + 1).to(BF)
    got = tnorm.triton_rms_norm(x, w, 1e-6, kp)
    assert torch.equal(got, reference_rms_norm(x, w, 1e-6, kp))
    for i in (0, 5, rows - 1):  # a row alone (decode) is the row in the batch (prefill)
        assert torch.equal(tnorm.triton_rms_norm(x[i : i + 1], w, 1e-6, kp)[0], got[i])
    # twin: torch's own RMSNorm (another sum order) differs in float32 (bf16 can round it away)
    stock = torch.nn.functional.rms_norm(x.float(), (n,), w.float(), 1e-6).to(dtype)
    assert dtype == BF or not torch.equal(stock, got)


def test_rms_norm_under_autograd_keeps_the_forward_bits(kp):
    x = _randn(6, 1024, seed=3).requires_grad_()
    w = (_randn(1024, seed=4, scale=0.2) + 1).requires_grad_()
    y = tnorm.triton_rms_norm(x, w, 1e-6, kp)
    with torch.no_grad():
        assert torch.equal(y, tnorm.triton_rms_norm(x, w, 1e-6, kp))
    y.sum().backward()
    assert x.grad is not None and w.grad is not None and torch.isfinite(x.grad).all()


class _Copies(TorchDispatchMode):
    """Counts the aten copies of a tensor's data (``clone``, ``contiguous``'s copy)."""

    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        src = args[1] if name == "copy_" else args[0] if args else None
        if name == "clone" or (name == "copy_" and src.dtype != torch.uint8):
            self.copies += 1  # uint8 ``copy_``: the interpreter's own argument copies
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [BF, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("hn", [128, 100])
def test_rms_norm_reads_the_k_heads_of_the_fused_qkv_in_place(kp, dtype, hn):
    """QK-norm's k: megatron splits the fused QKV ``[s, b, groups, (rep + 2) * hn]`` along its
    last dim, so k's head rows are ``(rep + 2) * hn`` apart, not ``hn``. The kernel reads them in
    place (no copy) with the bits of the reference and of a contiguous copy. Twin: the same
    storage read as if contiguous (what a kernel ignoring the strides would read) gives other
    bits."""
    s, b, groups, rep = 5, 2, 3, 2
    mixed = _randn(s, b, groups, (rep + 2) * hn, seed=hn, dtype=dtype)
    k = mixed[..., rep * hn : (rep + 1) * hn]
    w = (_randn(hn, seed=hn + 1, scale=0.2) + 1).to(BF)
    with _Copies() as seen:
        got = tnorm.triton_rms_norm(k, w, 1e-6, kp)
    assert seen.copies == 0
    assert got.shape == k.shape
    assert torch.equal(got, reference_rms_norm(k, w, 1e-6, kp))
    assert torch.equal(got, tnorm.triton_rms_norm(k.contiguous(), w, 1e-6, kp))
    k3 = k.view(-1, groups, hn)
    assert k3.stride(1) == (rep + 2) * hn  # the fused row's stride: k is not contiguous
    packed = torch.as_strided(k3, k3.shape, (groups * hn, hn, 1))
    wrong, _ = tnorm._forward(packed, w, 1e-6, bool(kp.norm_cast_before_weight))
    assert not torch.equal(wrong.view(k.shape), got)


def test_silu_glu_reads_the_fc1_halves_in_place(kp):
    """The MLP's gate and up are the two halves of the fc1 output: the forward reads them in
    place (no copy) with the reference's bits. Twin: the contiguous copies the forward used to
    make are seen by the counter."""
    fc1 = _randn(2, 9, 2 * 100, seed=11, dtype=BF)
    gate, up = torch.chunk(fc1, 2, dim=-1)
    with _Copies() as seen:
        got = tmlp.triton_silu_glu(gate, up, kp)
    assert seen.copies == 0
    assert torch.equal(got, reference_silu_glu(gate, up, kp))
    with _Copies() as seen:
        gate.contiguous(), up.contiguous()
    assert seen.copies == 2


@pytest.mark.parametrize("shape", [(32, 16, 128), (5, 8, 64), (3, 1, 6)])
@pytest.mark.parametrize("dtype", [BF, torch.float32], ids=["bf16", "fp32"])
def test_rope_is_the_references_bits_and_row_invariant(kp, shape, dtype):
    t, _, d = shape
    x = _randn(*shape, seed=t * d, dtype=dtype)
    cos, sin = rope_cos_sin(torch.arange(t, device=DEV) * 1013, d, 1e6, None, kp)
    got = trope.triton_apply_rope(x, cos, sin, kp)
    assert got.dtype == dtype and torch.equal(got, reference_apply_rope(x, cos, sin, kp))
    i = t - 1
    alone = trope.triton_apply_rope(x[i : i + 1], cos[i : i + 1], sin[i : i + 1], kp)
    assert torch.equal(alone[0], got[i])
    # twin: one rounding for x*cos + rot*sin (an FMA) gives other bits somewhere
    rot = torch.cat([-x.float()[..., d // 2 :], x.float()[..., : d // 2]], dim=-1)
    fused = torch.addcmul(rot * sin[:, None, :], x.float(), cos[:, None, :]).to(dtype)
    assert dtype == BF or not torch.equal(fused, got)


@pytest.mark.parametrize("shape", [(32, 3072), (7, 100)])
@pytest.mark.parametrize("dtype", [BF, torch.float32], ids=["bf16", "fp32"])
def test_silu_glu_is_the_references_bits_and_row_invariant(kp, shape, dtype):
    gate, up = _randn(*shape, seed=1, scale=6, dtype=dtype), _randn(*shape, seed=2, dtype=dtype)
    got = tmlp.triton_silu_glu(gate, up, kp)
    want = reference_silu_glu(gate, up, kp)
    if CUDA or dtype == BF:
        assert torch.equal(got, want)
    else:  # numpy's float32 exp under the interpreter: a few ulps off torch's
        assert torch.allclose(got, want, rtol=1e-6, atol=0)
    assert torch.equal(tmlp.triton_silu_glu(gate[3:4], up[3:4], kp)[0], got[3])
    # twin: silu as g * (1 / (1 + exp(-g))) (two roundings where the contract has one division)
    # differs in float32 (bf16 can round it away). Not torch's F.silu: on CUDA it is the
    # contract's own formula, so it would be no twin there.
    g32 = gate.float()
    twin = (g32 * (1.0 / (1.0 + torch.exp(-g32)))).to(dtype) * up
    assert dtype == BF or not torch.equal(twin, got)


def test_rope_and_silu_glu_under_autograd_keep_the_forward_bits_and_match_float64(kp):
    """Under autograd the one-kernel forwards run too (the trainer's training forward then has
    the rollout's bits), with analytic backwards checked against float64 autograd."""
    x = _randn(4, 3, 8, seed=5).requires_grad_()
    cos, sin = rope_cos_sin(torch.arange(4, device=DEV) * 77, 8, 1e4, None, kp)
    y = trope.triton_apply_rope(x, cos, sin, kp)
    with torch.no_grad():
        assert torch.equal(y, trope.triton_apply_rope(x, cos, sin, kp))
    dy = _randn(4, 3, 8, seed=6)
    (dx,) = torch.autograd.grad(y, x, dy)
    x64 = x.detach().double().requires_grad_()
    y64 = reference_apply_rope(
        x64, cos.double(), sin.double(), dataclasses.replace(kp, rope_dtype="float64")
    )
    (want,) = torch.autograd.grad(y64, x64, dy.double())
    torch.testing.assert_close(dx.double(), want, rtol=1e-6, atol=1e-6)

    gate, up = _randn(5, 40, seed=7).requires_grad_(), _randn(5, 40, seed=8).requires_grad_()
    out = tmlp.triton_silu_glu(gate, up, kp)
    with torch.no_grad():
        assert torch.equal(out, tmlp.triton_silu_glu(gate, up, kp))
    d = _randn(5, 40, seed=9)
    got = torch.autograd.grad(out, (gate, up), d)
    g64, u64 = gate.detach().double().requires_grad_(), up.detach().double().requires_grad_()
    want = torch.autograd.grad(torch.nn.functional.silu(g64) * u64, (g64, u64), d.double())
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


def _numpy_exp_chunk_sums(x_TV: torch.Tensor, m_T: torch.Tensor, block: int) -> torch.Tensor:
    """``reference_chunk_sums`` with numpy's float32 ``exp`` (the interpreter's): isolates the
    summation order from the ``exp`` implementation."""
    import math

    import numpy as np

    from contractgen.adapters.kernels.reduce import fixed_sum

    T, V = x_TV.shape
    C = math.ceil(V / block)
    x_p = torch.nn.functional.pad(x_TV, (0, C * block - V), value=-math.inf)
    e = torch.from_numpy(np.exp((x_p - m_T[:, None]).numpy()))
    return fixed_sum(e.view(T, C, block))


@pytest.mark.parametrize(
    ("shape", "block"), [((2, 40000), 128), ((4, 1000), 128), ((4, 1000), 64), ((2, 130), 64)]
)
def test_logsoftmax_chunk_sums_are_the_references_bits_and_row_invariant(shape, block):
    from contractgen.adapters.kernels.logsoftmax import reference_chunk_sums
    from contractgen.adapters.kernels.triton import logsoftmax as tls

    x = _randn(*shape, seed=shape[1], scale=5)
    m = x.amax(-1)
    got = tls.triton_chunk_sums(x, m, block)
    want = reference_chunk_sums(x, m, block) if CUDA else _numpy_exp_chunk_sums(x, m, block)
    assert torch.equal(got, want)
    assert torch.equal(tls.triton_chunk_sums(x[1:2], m[1:2], block)[0], got[1])
    # twin: each chunk summed left to right (another association) differs (over enough
    # chunks). Not torch.sum: on CUDA its warp tree can be the contract's halving tree.
    if shape[1] < 1000:
        return
    pad = got.shape[1] * block - shape[1]
    x_p = torch.nn.functional.pad(x, (0, pad), value=-float("inf"))
    e = torch.exp(x_p - m[:, None]).view(shape[0], -1, block)
    twin = e[..., 0]
    for j in range(1, block):
        twin = twin + e[..., j]
    assert not torch.equal(twin, reference_chunk_sums(x, m, block))


def test_logprob_backward_matches_float64_autograd():
    """The token logprob's gradient in one pass (not part of the contract's bits) against float64
    autograd of ``log_softmax(x)[tok]``, for a shard that owns some rows' tokens and not others'."""
    from contractgen.adapters.kernels.triton import logsoftmax as tls

    T, V = 5, 3000
    x = _randn(T, V, seed=9, scale=4)
    m = x.amax(-1)
    s = torch.exp(x - m[:, None]).sum(-1)
    idx = torch.tensor([0, 17, 2999, 5, 1000], device=DEV)
    owned = torch.tensor([True, False, True, True, False], device=DEV)
    g = _randn(T, seed=10, scale=1)
    got = tls.triton_logprob_backward(x, m, s, idx, owned, g)
    x64 = x.double().requires_grad_()
    lp = torch.log_softmax(x64, -1).gather(1, idx[:, None])[:, 0]
    (grad64,) = torch.autograd.grad(lp, x64, g.double() * owned)
    # a shard that does not own the token still gets -g * softmax
    grad64 = grad64 - (g.double() * ~owned)[:, None] * torch.softmax(x64, -1).detach()
    torch.testing.assert_close(got.double(), grad64, rtol=1e-5, atol=1e-7)
