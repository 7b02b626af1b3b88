"""The scalar arithmetic every Triton kernel of the library shares, spelled out so each add and
rounding is torch's: round-to-nearest-even casts (``_round``, ``_to_out``), torch's add of two
accumulation-dtype values (``_add``), opaque float32 add and multiply (``_ieee_add``,
``_ieee_mul``: no folding into a dot or an FMA), and the interpreter's row-independent dot.

A leaf module: the matmul, attention, MLP, log-softmax and tree-sum kernels all import it.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Triton's CPU interpreter (CI): same kernels, each tile's dot through ``interpreter_dot``.
INTERPRET: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")

_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def interpreter_dot(a, b):
    """The interpreter's stand-in for a tensor-core dot ``a @ b``: every product exact in
    float64, summed along K per output element, rounded once to float32. A row's result never
    depends on the other rows of the tile, as on the GPU; the interpreter's own ``tl.dot``
    (numpy's matmul) does not promise that (its BLAS blocks rows), and it misreads bf16 bits."""
    prod = a.to(tl.float64)[:, :, None] * b.to(tl.float64)[None, :, :]
    return tl.sum(prod, 1).to(tl.float32)


@triton.jit
def _round(v, ACC: tl.constexpr):
    """float32 ``v`` rounded to nearest-even in ``ACC`` (the GPU default, spelled out: the
    interpreter truncates otherwise)."""
    if ACC == tl.float32:
        return v
    if INTERPRET and ACC == tl.bfloat16:  # the interpreter's cast rounds ties up: do it by bits
        u = v.to(tl.uint32, bitcast=True)
        u = u + 0x7FFF + ((u >> 16) & 1)
        return (u >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return v.to(ACC, fp_downcast_rounding="rtne")


@triton.jit
def _to_out(v, ACC: tl.constexpr, OUT: tl.constexpr):
    """A finished ``ACC`` sum in the output dtype ``OUT``: unchanged where they agree, else
    rounded once (``_round``: float32 to bf16 nearest even, as torch's ``.to``); a bf16 sum
    widened to float32 is exact."""
    if OUT == ACC:
        return v
    elif OUT == tl.float32:
        return v.to(tl.float32)
    else:
        return _round(v, OUT)


@triton.jit
def _add(a, b, ACC: tl.constexpr):
    """``a + b`` as torch adds two ``ACC`` tensors: in float32, rounded once to ``ACC``. A float32
    sum is one IEEE add (``_ieee_add``), never folded into a dot's accumulator."""
    if ACC == tl.float32:
        return _ieee_add(a, b)
    return _round(a.to(tl.float32) + b.to(tl.float32), ACC)


@triton.jit
def _ieee_add(a, b):
    """``a + b`` in float32, round to nearest, as an opaque instruction. Triton rewrites
    ``dot(x, y, 0) + c`` into ``dot(x, y, c)`` (the tensor core adds ``c`` in its accumulator,
    with other bits); under ``fixed_runs`` a run of one tile is such a dot, and the counter's add
    of it was folded in some launches and not in others (an H200, 2026-12-03:
    ``benchmarks/diag_fixed_runs.py``: one-tile runs differed between launches, longer runs
    agreed). With ``add.rn.f32`` the add stays an add. The interpreter has no PTX."""
    if INTERPRET:
        return a + b
    return tl.inline_asm_elementwise(
        "add.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def _ieee_mul(a, b):
    """``a * b`` in float32, round to nearest, as an opaque instruction: ptxas contracts a plain
    ``mul.f32`` followed by an add into one FMA (one rounding, not torch's two)."""
    if INTERPRET:
        return a * b
    return tl.inline_asm_elementwise(
        "mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
    )
