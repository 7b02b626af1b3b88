"""The analytic backwards of RMSNorm, RoPE and SiLU-GLU pass narrow operands straight into their
float32 products instead of writing float32 copies first (issue 32's backward: the casts were a
quarter of the step's elementwise kernels). A product with a float32 operand is computed in
float32 from the exact widening of the other, so the gradients must keep their bits: the old
functions are kept here verbatim and both run on the same inputs (signed zeros, tiny and large
values, every dtype the Triton backends take). On a CUDA device the comparison runs there too.
The twin computes one product in the narrow dtype, the shortcut that does change bits.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # as test_triton_small_ops: before the kernels
pytest.importorskip("triton")

from contractgen.adapters.kernels.norm import rms_norm_backward  # noqa: E402
from contractgen.adapters.kernels.triton.mlp import torch_silu_glu_backward  # noqa: E402
from contractgen.adapters.kernels.triton.rope import rope_backward  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
FLOATS = [torch.bfloat16, torch.float16, torch.float32]


# ----------------------------------------------------------------- the old functions, verbatim


def _legacy_rms_norm_backward(x, weight, r, dy, cast_before_weight: bool):
    md = torch.promote_types(x.dtype, torch.float32)
    x_hat = x.to(md) * r.to(md)[..., None]
    factor = x_hat.to(x.dtype).to(md) if cast_before_weight else x_hat
    dy = dy.to(md)
    g = dy * weight.to(md)
    dx = r.to(md)[..., None] * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    dw = (dy * factor).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


def _legacy_silu_glu_backward(gate, up, dy):
    g, u, d = gate.float(), up.float(), dy.float()
    sig = torch.sigmoid(g)
    act = (g * sig).to(gate.dtype).float()
    d_gate = d * u * sig * (1 + g * (1 - sig))
    return d_gate.to(gate.dtype), (d * act).to(up.dtype)


def _legacy_rope_backward(dy_LHD, cos_LD, sin_LD):
    half = dy_LHD.shape[-1] // 2
    dy = dy_LHD.float()
    c, s = cos_LD.float()[:, None, :], sin_LD.float()[:, None, :]
    ds = dy * s
    dx = dy * c + torch.cat([ds[..., half:], -ds[..., :half]], dim=-1)
    return dx.to(dy_LHD.dtype)


# ------------------------------------------------------------------------------------ inputs


def _values(shape, seed: int, dtype, device) -> torch.Tensor:
    """Normal values over six decades of magnitude, with signed zeros planted."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 10.0 ** torch.randint(-3, 3, shape, generator=g)
    flat = x.view(-1)
    flat[::17] = 0.0
    flat[5::23] = -0.0
    return x.to(dtype).to(device)


def _bits(t: torch.Tensor) -> torch.Tensor:
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(ints[t.element_size()])


def _same(a: tuple, b: tuple) -> bool:
    return all(
        x.dtype == y.dtype and torch.equal(_bits(x), _bits(y)) for x, y in zip(a, b, strict=True)
    )


# ------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [*FLOATS, torch.float64])
@pytest.mark.parametrize("cast_before_weight", [True, False])
def test_rms_norm_backward_keeps_its_bits(device, dtype, cast_before_weight):
    # hidden rows and per-head rows (QK-norm: a non-contiguous slice of the fused QKV)
    for shape, seed in (((37, 96), 0), ((11, 6, 64), 1)):
        qkv = _values((*shape[:-1], 2 * shape[-1]), seed, dtype, device)
        x = qkv[..., : shape[-1]]
        weight = _values(shape[-1:], seed + 10, torch.bfloat16, device)
        md = torch.promote_types(dtype, torch.float32)
        r = torch.rsqrt(x.to(md).square().mean(-1) + 1e-6)
        dy = _values(shape, seed + 20, dtype, device)
        args = (x, weight, r, dy, cast_before_weight)
        assert _same(rms_norm_backward(*args), _legacy_rms_norm_backward(*args))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gate_dtype", FLOATS)
@pytest.mark.parametrize("up_dtype", FLOATS)
def test_silu_glu_backward_keeps_its_bits(device, gate_dtype, up_dtype):
    fc1 = _values((29, 2 * 160), 2, gate_dtype, device)
    gate, up = torch.chunk(fc1, 2, dim=-1)  # the MLP's halves: non-contiguous
    up = up.to(up_dtype)
    dy = _values((29, 160), 3, gate_dtype, device)
    assert _same(torch_silu_glu_backward(gate, up, dy), _legacy_silu_glu_backward(gate, up, dy))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_rope_backward_keeps_its_bits(device, dtype):
    dy = _values((19, 6, 64), 4, dtype, device)
    angle = _values((19, 64), 5, torch.float32, device)
    cos, sin = angle.cos(), angle.sin()
    assert _same((rope_backward(dy, cos, sin),), (_legacy_rope_backward(dy, cos, sin),))


def test_twin_a_narrow_product_changes_bits():
    """Passing both operands of ``d * up`` narrow (``dy`` not widened either) rounds that
    product to bf16 before the float32 chain: the comparison above sees that."""
    gate, up, dy = (_values((29, 160), seed, torch.bfloat16, "cpu") for seed in (2, 3, 4))
    g = gate.float()
    sig = torch.sigmoid(g)
    narrow = ((dy * up) * sig * (1 + g * (1 - sig))).to(gate.dtype)
    assert not torch.equal(_bits(narrow), _bits(_legacy_silu_glu_backward(gate, up, dy)[0]))
