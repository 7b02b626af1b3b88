"""Triton log-softmax chunk sums: ``kernels.logsoftmax.reference_chunk_sums`` in one pass.

The reference pads the logits with ``-inf`` to whole chunks (a copy), subtracts the row max,
takes ``exp`` and sums each ``block``-wide chunk by ``fixed_sum``'s halving tree: about ten full
passes over ``[tokens, vocab]`` float32 (at 16k tokens of a 151,936-token vocab, 10 GB each). This
kernel reads each logit once: ``exp(x - m)`` with the device library's ``expf`` (what torch's CUDA
``exp`` calls; not the fast ``ex2.approx`` of ``tl.exp``), columns past the vocab as ``-inf``
(``exp`` gives 0, as the padding does), then the same halving tree in each chunk (an axis of two
summed per level: one add, whatever the compiler does with it). Each row's sums depend on that row
only. The chunks' own tree (``_pairwise_over_chunks``) stays in PyTorch: it is ``[tokens, chunks]``.

``triton_logprob_backward``: the token logprob's gradient, ``g * (onehot - exp(x - m) / s)``, in
one pass (not part of the contract's bits; checked against float64).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..logsoftmax import reference_chunk_sums, reference_logprob_backward
from .arith import INTERPRET

CHUNKS_PER_PROGRAM = 8
BACKWARD_BLOCK = 2048


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _expf(x):
    """The device library's ``expf``; numpy's under the interpreter (no libdevice there)."""
    if INTERPRET:
        return tl.exp(x)
    return libdevice.exp(x)


@triton.jit
def _chunk_sums_fwd(
    logits_ptr, m_ptr, s_ptr, V, C, stride_x,
    BLOCK: tl.constexpr, LOG2B: tl.constexpr, CPP: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1) * CPP + tl.arange(0, CPP)
    col = chunk[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]  # [CPP, BLOCK]
    x = tl.load(logits_ptr + row * stride_x + col, mask=col < V, other=-float("inf"))
    e = _expf(x - tl.load(m_ptr + row))
    for i in tl.static_range(LOG2B):
        e = tl.reduce(tl.reshape(e, (CPP, 2, BLOCK >> (i + 1))), 1, _add)
    tl.store(s_ptr + row * C + chunk, tl.reshape(e, (CPP,)), mask=chunk < C)


def supports(x_TV: torch.Tensor, block: int) -> bool:
    """float32 logits, a power-of-two chunk of at most 1024 columns."""
    return (
        x_TV.dtype == torch.float32
        and x_TV.dim() == 2
        and 0 < block <= 1024
        and block & (block - 1) == 0
        and x_TV.numel() > 0
    )


def triton_chunk_sums(x_TV: torch.Tensor, m_T: torch.Tensor, block: int) -> torch.Tensor:
    """``[T, C]``: ``sum(exp(x - m))`` of each ``block``-wide vocab chunk (the reference's bits);
    what it does not take runs the reference."""
    if not supports(x_TV, block):
        return reference_chunk_sums(x_TV, m_T, block)
    x = x_TV if x_TV.stride(-1) == 1 else x_TV.contiguous()
    T, V = x.shape
    C = triton.cdiv(V, block)
    s = torch.empty(T, C, dtype=torch.float32, device=x.device)
    m = m_T.to(torch.float32).contiguous()
    _chunk_sums_fwd[(T, triton.cdiv(C, CHUNKS_PER_PROGRAM))](
        x, m, s, V, C, x.stride(0), block, block.bit_length() - 1, CHUNKS_PER_PROGRAM,
        num_warps=4,
    )  # fmt: skip
    return s


@triton.jit
def _logprob_bwd(
    logits_ptr, m_ptr, s_ptr, idx_ptr, owned_ptr, g_ptr, grad_ptr, V, stride_x,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < V
    x = tl.load(logits_ptr + row * stride_x + col, mask=mask, other=0.0)
    m, s, g = tl.load(m_ptr + row), tl.load(s_ptr + row), tl.load(g_ptr + row)
    tok = tl.load(idx_ptr + row)
    own = tl.load(owned_ptr + row) != 0
    p = _expf(x - m) / s
    grad = tl.where((col == tok) & own, g - g * p, -g * p)
    tl.store(grad_ptr + row * V + col, grad, mask=mask)


def triton_logprob_backward(x_TV, m_T, s_T, local_idx_T, owned_T, g_T) -> torch.Tensor:
    """``reference_logprob_backward`` in one pass over the logits (the reference makes about
    eight); gradients are checked against float64, not bitwise."""
    if x_TV.dtype != torch.float32 or x_TV.dim() != 2 or x_TV.numel() == 0:
        return reference_logprob_backward(x_TV, m_T, s_T, local_idx_T, owned_T, g_T)
    x = x_TV if x_TV.stride(-1) == 1 else x_TV.contiguous()
    T, V = x.shape
    grad = torch.empty(T, V, dtype=torch.float32, device=x.device)
    f32 = {"dtype": torch.float32}
    _logprob_bwd[(T, triton.cdiv(V, BACKWARD_BLOCK))](
        x, m_T.to(**f32).contiguous(), s_T.to(**f32).contiguous(),
        local_idx_T.to(torch.int64).contiguous(), owned_T.to(torch.int8).contiguous(),
        g_T.to(**f32).contiguous(), grad, V, x.stride(0), BACKWARD_BLOCK, num_warps=4,
    )  # fmt: skip
    return grad
