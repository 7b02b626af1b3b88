"""Triton SiLU-GLU: ``kernels.mlp.silu_glu`` in one kernel (the reference is seven launches).

Same operations, same roundings: ``gate`` widened to float32, ``g / (1 + exp(-g))`` with the
device library's ``expf`` (libdevice, not the fast ``ex2.approx`` that ``tl.exp`` lowers to) and
an IEEE division, rounded to ``gate``'s dtype, then multiplied by ``up`` in that dtype (a float32
product rounded once). Elementwise: any batch gives each element the same bits. Under autograd the same forward runs,
with the analytic backward (``silu_glu_backward``, float32; checked against float64, not bitwise),
so the trainer's training forward has the bits of the rollout's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..policy import KernelPolicy
from .matmul import INTERPRET, _ieee_add, _ieee_mul, _round

BLOCK = 1024


@triton.jit
def _expf(x):
    """The device library's ``expf`` (what torch's CUDA ``exp`` calls); numpy's under the
    interpreter, which has no libdevice."""
    if INTERPRET:
        return tl.exp(x)
    return libdevice.exp(x)


@triton.jit
def _silu_glu_fwd(gate_ptr, up_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + offs, mask=mask, other=0.0)
    y_ty = y_ptr.dtype.element_ty
    act = _round(tl.math.div_rn(g, _ieee_add(_expf(-g), 1.0)), y_ty)
    y = _round(_ieee_mul(act.to(tl.float32), u.to(y_ty).to(tl.float32)), y_ty)
    tl.store(y_ptr + offs, y, mask=mask)


def supports(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """bf16 / fp16 / fp32 operands of one shape."""
    floats = (torch.bfloat16, torch.float16, torch.float32)
    return gate.dtype in floats and up.dtype in floats and gate.shape == up.shape


def _forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g, u = gate.contiguous(), up.contiguous()
    y = torch.empty_like(g)
    _silu_glu_fwd[(triton.cdiv(g.numel(), BLOCK),)](g, u, y, g.numel(), BLOCK, num_warps=4)
    return y


def silu_glu_backward(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor):
    """``(d gate, d up)`` of ``y = silu(gate) * up`` (float32 math, inputs' dtypes out).

    ``up`` and the rounded ``act`` enter their products with float32 ``d`` in their own dtype:
    the product is computed in float32 from their exact widening, the bits of widening them
    first, without writing the float32 copies."""
    g, d = gate.float(), dy.float()
    sig = torch.sigmoid(g)
    act = (g * sig).to(gate.dtype)
    d_gate = d * up * sig * (1 + g * (1 - sig))
    return d_gate.to(gate.dtype), (d * act).to(up.dtype)


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
    from ..mlp import reference_silu_glu

    if not supports(gate, up) or gate.numel() == 0:
        return reference_silu_glu(gate, up, kp)
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _SiluGlu.apply(gate, up)
    return _forward(gate, up)
