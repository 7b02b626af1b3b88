"""The fused SiLU-GLU backward (one Triton kernel, issue 32) against the float32 chain it
replaces (``torch_silu_glu_backward``), bit for bit, on contiguous and strided operands.

On CUDA the kernel runs against the chain itself: both take ``sigmoid`` as ``1 / (1 + expf(-g))``
and round every product and sum on its own. Under the interpreter (CPU) the kernel's ``expf`` is
numpy's, which differs from torch's CPU ``exp`` in the last bit for about a third of the values
here; the kernel is then held to the chain's other operations exactly, with the chain's sigmoid
taken from numpy's ``exp`` (``_chain`` is the chain verbatim with the sigmoid passed in, and is
itself checked against ``torch_silu_glu_backward`` with torch's). Each bitwise test has a twin
that shows the comparison catches a one-ulp change or an FMA-contracted formula.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
pytest.importorskip("triton")

from contractgen.adapters.kernels.triton import mlp as tmlp  # noqa: E402

pytestmark = [pytest.mark.gpu] if CUDA else []
DEV = "cuda" if CUDA else "cpu"
FLOATS = [torch.bfloat16, torch.float16, torch.float32]
IDS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _numpy_sigmoid(g: torch.Tensor) -> torch.Tensor:
    """``1 / (1 + exp(-g))`` in float32 with numpy's ``exp``: the interpreter's kernel."""
    e = torch.from_numpy(np.exp((-g).cpu().numpy())).to(g.device)
    return 1.0 / (1.0 + e)


# the sigmoid the kernel computes on this device: torch's own on CUDA (libdevice expf)
KERNEL_SIGMOID = torch.sigmoid if CUDA else _numpy_sigmoid


def _chain(gate, up, dy, sigmoid=torch.sigmoid):
    """``torch_silu_glu_backward`` verbatim, with ``sigmoid`` passed in."""
    g, d = gate.float(), dy.float()
    sig = sigmoid(g)
    act = (g * sig).to(gate.dtype)
    d_gate = d * up * sig * (1 + g * (1 - sig))
    return d_gate.to(gate.dtype), (d * act).to(up.dtype)


def _values(shape, seed: int, dtype, scale: float = 4.0) -> torch.Tensor:
    """Normal values over four decades, with signed zeros planted."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale * 10.0 ** torch.randint(-2, 2, shape, generator=g)
    flat = x.view(-1)
    flat[::17] = 0.0
    flat[5::23] = -0.0
    return x.to(dtype).to(DEV)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _same(a: tuple, b: tuple) -> bool:
    return all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(_bits(x), _bits(y))
        for x, y in zip(a, b, strict=True)
    )


def _operands(layout: str, shape: tuple, dtype, up_dtype=None):
    """``(gate, up, dy)`` of ``shape``: ``contiguous``; ``halves`` (the fc1 output's two halves,
    one row stride); ``heads`` (rows two strides apart: ``[A, H, n]`` cut from ``[A, H + 1, n]``)."""
    *lead, n = shape
    if layout == "contiguous":
        gate, up = _values(shape, 1, dtype), _values(shape, 2, dtype, scale=1.0)
    elif layout == "halves":
        gate, up = torch.chunk(_values((*lead, 2 * n), 1, dtype), 2, dim=-1)
    else:
        a, h = lead
        gate = _values((a, h + 1, n), 1, dtype)[:, :h]
        up = _values((a, h + 1, n), 2, dtype, scale=1.0)[:, 1:]
    dy = _values(shape, 3, dtype, scale=1.0)
    return gate, up.to(up_dtype or dtype), dy


# [rows, n]: a tile of whole rows, odd sizes, a column tail (1500 > 1024), a row tail (37 % 8)
SHAPES = [(29, 160), (7, 100), (37, 100), (5, 1500), (1, 1), (3, 5, 33)]


def _cases():
    for shape in SHAPES:
        for layout in ("contiguous", "halves") + (("heads",) if len(shape) == 3 else ()):
            yield pytest.param(layout, shape, id=f"{layout}-{'x'.join(map(str, shape))}")


@pytest.mark.parametrize("layout, shape", list(_cases()))
@pytest.mark.parametrize("dtype", FLOATS, ids=IDS.get)
def test_fused_backward_is_the_chains_bits(layout, shape, dtype):
    gate, up, dy = _operands(layout, shape, dtype)
    assert layout == "contiguous" or gate.numel() == 1 or not gate.is_contiguous()
    got = tmlp.fused_silu_glu_backward(gate, up, dy)
    assert _same(got, _chain(gate, up, dy, KERNEL_SIGMOID))
    if CUDA:  # the shipped chain itself
        assert _same(got, tmlp.torch_silu_glu_backward(gate, up, dy))
    # the dispatcher runs the fused kernel here
    assert _same(tmlp.silu_glu_backward(gate, up, dy), got)


def test_twin_one_ulp_and_a_contracted_slope_are_seen():
    """The comparison above fails for a result one ulp off in one element, and for the slope
    ``1 + g * (1 - sig)`` rounded once (an FMA, what the kernel's separate IEEE ops prevent)."""
    gate, up, dy = _operands("halves", (29, 160), torch.bfloat16)
    got = tmlp.fused_silu_glu_backward(gate, up, dy)
    off = got[0].clone()
    off.view(torch.int16).view(-1)[7] += 1  # the next bf16 away from zero, in one element
    assert not _same((off, got[1]), got)

    def fma_slope_chain(gate, up, dy):
        g, d = gate.float(), dy.float()
        sig = KERNEL_SIGMOID(g)
        act = (g * sig).to(gate.dtype)
        slope = (1 + g.double() * (1 - sig).double()).float()  # exact product, one rounding
        return (d * up * sig * slope).to(gate.dtype), (d * act).to(up.dtype)

    gate, up, dy = _operands("contiguous", (64, 1024), torch.float32)
    assert not _same(tmlp.fused_silu_glu_backward(gate, up, dy), fma_slope_chain(gate, up, dy))


@pytest.mark.parametrize("gate_dtype", FLOATS, ids=IDS.get)
@pytest.mark.parametrize("up_dtype", FLOATS, ids=IDS.get)
def test_mixed_dtypes_keep_the_chains_bits(gate_dtype, up_dtype):
    gate, up, dy = _operands("halves", (37, 100), gate_dtype, up_dtype)
    got = tmlp.fused_silu_glu_backward(gate, up, dy)
    assert (got[0].dtype, got[1].dtype) == (gate_dtype, up_dtype)
    assert _same(got, _chain(gate, up, dy, KERNEL_SIGMOID))


def test_the_test_chain_is_the_shipped_chain():
    """``_chain`` with torch's sigmoid is ``torch_silu_glu_backward`` bit for bit (so the CPU
    comparison above, with numpy's sigmoid, holds the kernel to the shipped formula); its twin:
    the chain with the sigmoid numpy's ``exp`` gives is seen as different."""
    for dtype in FLOATS:
        gate, up, dy = _operands("halves", (29, 160), dtype)
        assert _same(_chain(gate, up, dy), tmlp.torch_silu_glu_backward(gate, up, dy))
    gate, up, dy = _operands("contiguous", (64, 1024), torch.float32)
    if not CUDA:
        assert not _same(_chain(gate, up, dy, _numpy_sigmoid), _chain(gate, up, dy))


def test_autograd_through_the_triton_silu_glu_uses_the_fused_backward(kp):
    """Under autograd on the fc1 halves: the gradients are the fused kernel's (and so, on CUDA,
    the chain's), the forward keeps its no-grad bits."""
    fc1 = _values((23, 2 * 96), 4, torch.bfloat16).requires_grad_()
    gate, up = torch.chunk(fc1, 2, dim=-1)
    y = tmlp.triton_silu_glu(gate, up, kp)
    with torch.no_grad():
        assert torch.equal(_bits(y), _bits(tmlp.triton_silu_glu(gate, up, kp)))
    dy = _values((23, 96), 5, torch.bfloat16)
    (d_fc1,) = torch.autograd.grad(y, fc1, dy)
    want = torch.cat(_chain(gate.detach(), up.detach(), dy, KERNEL_SIGMOID), dim=-1)
    assert torch.equal(_bits(d_fc1), _bits(want))


def _float64_errors(got: tuple, gate, up, dy) -> list[float]:
    g64, u64 = gate.double().requires_grad_(), up.double().requires_grad_()
    y64 = torch.nn.functional.silu(g64) * u64
    want = torch.autograd.grad(y64, (g64, u64), dy.double())
    return [(a.double() - b).abs().max().item() for a, b in zip(got, want[: len(got)], strict=True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=IDS.get)
def test_fused_backward_matches_float64_autograd_as_well_as_the_chain(dtype):
    """Against float64 autograd of ``silu(gate) * up``: within the output dtype's rounding, and
    no worse than the chain. Twin: the gradient without the sigmoid's slope term fails it."""
    gate, up, dy = _operands("halves", (41, 300), dtype)
    fused = tmlp.fused_silu_glu_backward(gate, up, dy)
    chain = tmlp.torch_silu_glu_backward(gate, up, dy)
    scale = [
        max(1e-30, t.abs().max().item()) for t in _chain(gate.double(), up.double(), dy.double())
    ]
    eps = torch.finfo(dtype).eps
    err_fused = _float64_errors(fused, gate, up, dy)
    err_chain = _float64_errors(chain, gate, up, dy)
    for ef, ec, s in zip(err_fused, err_chain, scale, strict=True):
        assert ef <= 4 * eps * s
        assert ef <= ec + eps * s  # on CUDA equal (same bits); an ulp's room for numpy's exp
    g, d = gate.float(), dy.float()
    no_slope = (d * up * torch.sigmoid(g)).to(dtype)
    assert _float64_errors((no_slope,), gate, up, dy)[0] > 4 * eps * scale[0]
