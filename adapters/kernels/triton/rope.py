"""Triton RoPE: ``kernels.rope.apply_rope`` in one kernel (the reference is about seven launches).

Same operations, same roundings: ``x`` widened to float32, ``x * cos`` and ``rotate_half(x) *
sin`` each rounded (``mul.rn.f32``: no FMA contraction), their sum rounded (``add.rn.f32``), then
rounded once to ``x``'s dtype. ``rotate_half`` negates (exact). Each (token, head) row depends on
its own values and its position's ``cos``/``sin`` row only, so any batch gives it the same bits.
Under autograd the same forward runs, with the analytic backward (RoPE is a rotation:
``dx = dy * cos + rotate_half^T(dy * sin)``, in float32; checked against float64, not bitwise),
so the trainer's training forward has the bits of its scoring forward and of the rollout. For a
rope dtype other than float32 the reference runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._dtypes import dtype_of
from ..policy import KernelPolicy
from ..rope import reference_apply_rope
from .arith import _ieee_add, _ieee_mul, _round


@triton.jit
def _rope_fwd(
    x_ptr, cos_ptr, sin_ptr, y_ptr, H,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask_d = offs_d < HALF
    mask = (offs_h[:, None] < H) & mask_d[None, :]
    row = (t.to(tl.int64) * H + offs_h[:, None]) * (2 * HALF) + offs_d[None, :]
    x1 = tl.load(x_ptr + row, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + row + HALF, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.load(cos_ptr + t * (2 * HALF) + offs_d, mask=mask_d, other=0.0)[None, :]
    c2 = tl.load(cos_ptr + t * (2 * HALF) + HALF + offs_d, mask=mask_d, other=0.0)[None, :]
    s1 = tl.load(sin_ptr + t * (2 * HALF) + offs_d, mask=mask_d, other=0.0)[None, :]
    s2 = tl.load(sin_ptr + t * (2 * HALF) + HALF + offs_d, mask=mask_d, other=0.0)[None, :]
    y_ty = y_ptr.dtype.element_ty
    y1 = _ieee_add(_ieee_mul(x1, c1), _ieee_mul(-x2, s1))
    y2 = _ieee_add(_ieee_mul(x2, c2), _ieee_mul(x1, s2))
    tl.store(y_ptr + row, _round(y1, y_ty), mask=mask)
    tl.store(y_ptr + row + HALF, _round(y2, y_ty), mask=mask)


def supports(x_LHD: torch.Tensor, cos_LD: torch.Tensor, kp: KernelPolicy) -> bool:
    """float32 rope math, a 3-d ``x`` of an even head dim, one ``cos`` row per token."""
    floats = (torch.bfloat16, torch.float16, torch.float32)
    return (
        dtype_of(kp.rope_dtype) == torch.float32
        and x_LHD.dim() == 3
        and x_LHD.dtype in floats
        and x_LHD.shape[-1] % 2 == 0
        and cos_LD.shape == (x_LHD.shape[0], x_LHD.shape[-1])
        and x_LHD.numel() > 0
    )


def _forward(x_LHD: torch.Tensor, cos_LD: torch.Tensor, sin_LD: torch.Tensor) -> torch.Tensor:
    x = x_LHD.contiguous()
    cos = cos_LD.to(torch.float32).contiguous()
    sin = sin_LD.to(torch.float32).contiguous()
    T, H, D = x.shape
    y = torch.empty_like(x)
    block_h = min(triton.next_power_of_2(H), 16)
    _rope_fwd[(T, triton.cdiv(H, block_h))](
        x, cos, sin, y, H, D // 2, block_h, triton.next_power_of_2(D // 2), num_warps=2
    )
    return y


def rope_backward(dy_LHD: torch.Tensor, cos_LD: torch.Tensor, sin_LD: torch.Tensor):
    """``dx`` of ``y = x * cos + rotate_half(x) * sin`` (float32 math, ``dy``'s dtype out).

    ``dy`` (bf16 / fp16 / fp32, ``supports``) enters its products with the float32 tables in its
    own dtype: computed in float32 from its exact widening, without writing a float32 copy."""
    half = dy_LHD.shape[-1] // 2
    c, s = cos_LD.float()[:, None, :], sin_LD.float()[:, None, :]
    ds = dy_LHD * s
    # rotate_half^T: (a, b) -> (b, -a)
    dx = dy_LHD * c + torch.cat([ds[..., half:], -ds[..., :half]], dim=-1)
    return dx.to(dy_LHD.dtype)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_LHD, cos_LD, sin_LD):
        ctx.save_for_backward(cos_LD, sin_LD)
        return _forward(x_LHD, cos_LD, sin_LD)

    @staticmethod
    def backward(ctx, dy_LHD):
        cos_LD, sin_LD = ctx.saved_tensors
        return rope_backward(dy_LHD, cos_LD, sin_LD), None, None


def triton_apply_rope(
    x_LHD: torch.Tensor, cos_LD: torch.Tensor, sin_LD: torch.Tensor, kp: KernelPolicy
):
    """The Triton backend of ``apply_rope`` (same signature and bits); what it does not take runs
    the reference. Under autograd, ``rope_backward``'s gradient."""
    if not supports(x_LHD, cos_LD, kp):
        return reference_apply_rope(x_LHD, cos_LD, sin_LD, kp)
    if torch.is_grad_enabled() and x_LHD.requires_grad:
        return _Rope.apply(x_LHD, cos_LD.detach(), sin_LD.detach())
    return _forward(x_LHD, cos_LD, sin_LD)
