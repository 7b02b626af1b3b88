"""Triton SiLU-GLU: ``kernels.mlp.silu_glu`` in one kernel (the reference is seven launches),
and its backward in one kernel (``torch_silu_glu_backward``'s float32 chain is fourteen for bf16).

Forward: same operations, same roundings as the reference. ``gate`` is widened to float32;
``g / (1 + exp(-g))`` uses the device library's ``expf`` (libdevice, not the fast ``ex2.approx``
that ``tl.exp`` lowers to) and an IEEE division; the result is rounded to ``gate``'s dtype, then
multiplied by ``up`` in that dtype (a float32 product rounded once). Elementwise: any batch gives
each element the same bits.

Backward: the analytic gradient, ``torch_silu_glu_backward``'s operations one by one in float32.
``sigmoid`` is ``1 / (1 + expf(-g))``, torch's CUDA formula; every product and sum is a separate
IEEE instruction, so none is contracted into an FMA (torch runs each as its own kernel). So on
CUDA the fused kernel has the chain's bits (``tests/kernels/test_silu_glu_backward.py``). The
gradient is checked against float64 autograd too. Under the interpreter ``expf`` is numpy's,
which may differ from torch's CPU ``exp`` in the last bit.

Both kernels read ``gate`` and ``up`` in place with their row strides (``rows.rows_AHn``): in the
trainer they are the two halves of the fc1 output, which are not contiguous.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..mlp import reference_silu_glu
from ..policy import KernelPolicy
from .arith import INTERPRET, _ieee_add, _ieee_mul, _round
from .rows import rows_AHn

ELEMENTS = 1024  # elements of one program's [BLOCK_R, BLOCK_N] tile (4 warps, 8 a thread)


@triton.jit
def _expf(x):
    """The device library's ``expf`` (what torch's CUDA ``exp`` calls); numpy's under the
    interpreter, which has no libdevice."""
    if INTERPRET:
        return tl.exp(x)
    return libdevice.exp(x)


@triton.jit
def _at(offs_r, offs_n, H, s_a, s_h):
    """Element offsets of rows ``offs_r`` of an ``[A, H, n]`` operand with strides
    ``(s_a, s_h, 1)``, columns ``offs_n``: ``[BLOCK_R, BLOCK_N]``."""
    r = offs_r.to(tl.int64)
    return ((r // H) * s_a + (r % H) * s_h)[:, None] + offs_n[None, :]


@triton.jit
def _silu_glu_fwd(
    gate_ptr, up_ptr, y_ptr, rows, n, H, sg_a, sg_h, su_a, su_h,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_r[:, None] < rows) & (offs_n[None, :] < n)
    g = tl.load(gate_ptr + _at(offs_r, offs_n, H, sg_a, sg_h), mask=mask, other=0.0)
    g = g.to(tl.float32)
    u = tl.load(up_ptr + _at(offs_r, offs_n, H, su_a, su_h), mask=mask, other=0.0)
    y_ty = y_ptr.dtype.element_ty
    act = _round(tl.math.div_rn(g, _ieee_add(_expf(-g), 1.0)), y_ty)
    y = _round(_ieee_mul(act.to(tl.float32), u.to(y_ty).to(tl.float32)), y_ty)
    at_y = offs_r[:, None].to(tl.int64) * n + offs_n[None, :]
    tl.store(y_ptr + at_y, y, mask=mask)


@triton.jit
def _silu_glu_bwd(
    gate_ptr, up_ptr, dy_ptr, dgate_ptr, dup_ptr, rows, n, H, sg_a, sg_h, su_a, su_h, sd_a, sd_h,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_r[:, None] < rows) & (offs_n[None, :] < n)
    g = tl.load(gate_ptr + _at(offs_r, offs_n, H, sg_a, sg_h), mask=mask, other=0.0)
    g = g.to(tl.float32)
    u = tl.load(up_ptr + _at(offs_r, offs_n, H, su_a, su_h), mask=mask, other=0.0)
    u = u.to(tl.float32)
    d = tl.load(dy_ptr + _at(offs_r, offs_n, H, sd_a, sd_h), mask=mask, other=0.0)
    d = d.to(tl.float32)
    gate_ty = dgate_ptr.dtype.element_ty
    one = tl.full(g.shape, 1.0, tl.float32)
    sig = tl.math.div_rn(one, _ieee_add(one, _expf(-g)))  # torch.sigmoid on CUDA
    act = _round(_ieee_mul(g, sig), gate_ty)  # (g * sig).to(gate.dtype)
    slope = _ieee_add(one, _ieee_mul(g, one - sig))  # 1 + g * (1 - sig)
    d_gate = _ieee_mul(_ieee_mul(_ieee_mul(d, u), sig), slope)  # ((d * up) * sig) * slope
    d_up = _ieee_mul(d, act.to(tl.float32))  # d * act
    at = offs_r[:, None].to(tl.int64) * n + offs_n[None, :]
    tl.store(dgate_ptr + at, _round(d_gate, gate_ty), mask=mask)
    tl.store(dup_ptr + at, _round(d_up, dup_ptr.dtype.element_ty), mask=mask)


FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def supports(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """bf16 / fp16 / fp32 operands of one shape."""
    return gate.dtype in FLOATS and up.dtype in FLOATS and gate.shape == up.shape


def _launch(n: int, rows: int) -> tuple[tuple[int, int], int, int]:
    """``(grid, BLOCK_R, BLOCK_N)`` for ``rows`` rows of ``n``: a row of at most ``ELEMENTS``
    columns per tile, as many rows as fill it."""
    block_n = min(triton.next_power_of_2(n), ELEMENTS)
    block_r = ELEMENTS // block_n
    return (triton.cdiv(rows, block_r), triton.cdiv(n, block_n)), block_r, block_n


def _forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g3, u3 = rows_AHn(gate), rows_AHn(up)
    a, h, n = g3.shape
    y = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    grid, block_r, block_n = _launch(n, a * h)
    _silu_glu_fwd[grid](
        g3, u3, y, a * h, n, h, g3.stride(0), g3.stride(1), u3.stride(0), u3.stride(1),
        block_r, block_n, num_warps=4,
    )  # fmt: skip
    return y


def torch_silu_glu_backward(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor):
    """``(d gate, d up)`` of ``y = silu(gate) * up`` as a chain of torch ops (float32 math,
    inputs' dtypes out): the CPU path, and the spec ``fused_silu_glu_backward`` is held to.

    ``up`` and the rounded ``act`` enter their products with float32 ``d`` in their own dtype:
    the product is computed in float32 from their exact widening, the bits of widening them
    first, without writing the float32 copies."""
    g, d = gate.float(), dy.float()
    sig = torch.sigmoid(g)
    act = (g * sig).to(gate.dtype)
    d_gate = d * up * sig * (1 + g * (1 - sig))
    return d_gate.to(gate.dtype), (d * act).to(up.dtype)


def fused_silu_glu_backward(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor):
    """``torch_silu_glu_backward`` in one kernel launch: ``gate``, ``up`` and ``dy`` read in
    place (strided rows), ``d gate`` and ``d up`` written in ``gate``'s and ``up``'s dtypes."""
    g3, u3, d3 = rows_AHn(gate), rows_AHn(up), rows_AHn(dy)
    a, h, n = g3.shape
    d_gate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    d_up = torch.empty(up.shape, dtype=up.dtype, device=up.device)
    grid, block_r, block_n = _launch(n, a * h)
    _silu_glu_bwd[grid](
        g3, u3, d3, d_gate, d_up, a * h, n, h, g3.stride(0), g3.stride(1), u3.stride(0),
        u3.stride(1), d3.stride(0), d3.stride(1), block_r, block_n, num_warps=4,
    )  # fmt: skip
    return d_gate, d_up


def silu_glu_backward(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor):
    """``(d gate, d up)`` of ``y = silu(gate) * up``: the fused kernel on CUDA (and under the
    interpreter), ``torch_silu_glu_backward`` for what it does not take."""
    fused = (gate.is_cuda or INTERPRET) and supports(gate, up) and dy.dtype in FLOATS
    if fused and dy.shape == gate.shape and gate.numel() > 0:
        return fused_silu_glu_backward(gate, up, dy)
    return torch_silu_glu_backward(gate, up, dy)


class _SiluGlu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return _forward(gate, up)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        return silu_glu_backward(gate, up, dy)


def triton_silu_glu(gate: torch.Tensor, up: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """The Triton backend of ``silu_glu`` (same signature and bits); what it does not take runs
    the reference. Under autograd, ``silu_glu_backward``'s gradient."""
    if not supports(gate, up) or gate.numel() == 0:
        return reference_silu_glu(gate, up, kp)
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _SiluGlu.apply(gate, up)
    return _forward(gate, up)
