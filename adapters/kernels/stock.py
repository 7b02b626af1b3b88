"""Stock (non-contract) variants: drop-in replacements for fault injection and "twin" tests.

Each mirrors what an engine does without the contract switch, so a test that swaps one in must see
a difference: plain GEMMs, backend all-reduce orders, fused reduce+residual with a single rounding,
fused QK-norm+RoPE without the intermediate rounding, another log-softmax dtype, another KV chunk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._dtypes import dtype_of
from .all_reduce import all_gather_exact, nccl_all_reduce, world_size
from .attention import chunked_attention
from .policy import KernelPolicy
from .rope import apply_rope

__all__ = [
    "fp32_linear",
    "fused_all_reduce_residual",
    "fused_qk_norm_rope",
    "nccl_all_reduce",
    "other_chunk_attention",
    "plain_matmul",
    "reduce_scatter_all_gather",
    "ring_all_reduce",
    "sdpa_attention",
    "stock_token_logprobs",
]


def plain_matmul(
    x_MK: torch.Tensor, w_NK: torch.Tensor, kp: KernelPolicy, *, out_dtype=None
) -> torch.Tensor:
    """``torch.matmul`` in ``x``'s dtype: kernel (and K order) chosen by shape, not invariant."""
    return torch.matmul(x_MK, w_NK.to(x_MK.dtype).T).to(out_dtype or x_MK.dtype)


def fp32_linear(
    x_MK: torch.Tensor, w_NK: torch.Tensor, kp: KernelPolicy, *, out_dtype=None
) -> torch.Tensor:
    """Dense math not forced to the policy dtype: one float32 GEMM, rounded once."""
    return torch.matmul(x_MK.float(), w_NK.float().T).to(out_dtype or x_MK.dtype)


def ring_all_reduce(t: torch.Tensor, group=None) -> torch.Tensor:
    """NCCL-ring-like order: chunk ``c`` of the flat tensor is accumulated starting at rank
    ``c+1`` and going around the ring (so each chunk has a different association)."""
    n = world_size(group)
    if n == 1:
        return t
    parts = [p.reshape(-1) for p in all_gather_exact(t, group)]
    bounds = [round(i * parts[0].numel() / n) for i in range(n + 1)]
    out = []
    for c in range(n):
        sl = slice(bounds[c], bounds[c + 1])
        acc = parts[(c + 1) % n][sl]
        for j in range(2, n + 1):
            acc = acc + parts[(c + j) % n][sl]
        out.append(acc)
    return torch.cat(out).view(t.shape)


def reduce_scatter_all_gather(t: torch.Tensor, group=None) -> torch.Tensor:
    """Reduce-scatter over the token dim (each rank sums its slice in float32, rank order, one
    rounding), then all-gather: SGLang's path when reduce-scatter is not disabled."""
    n = world_size(group)
    if n == 1:
        return t
    parts = all_gather_exact(t, group)
    acc = parts[0].float()
    for p in parts[1:]:
        acc = acc + p.float()
    return acc.to(t.dtype)


def fused_all_reduce_residual(
    partial: torch.Tensor,
    residual: torch.Tensor,
    kp: KernelPolicy,
    group=None,
    all_reduce=None,
    delta=None,
) -> torch.Tensor:
    """All-reduce fused with the residual add: rank partials (and a LoRA ``delta``, if any) and
    residual summed in float32, rounded once to the residual dtype (no rounding of the reduced
    value first)."""
    parts = all_gather_exact(partial, group) if world_size(group) > 1 else [partial]
    acc = residual.float()
    for p in parts:
        acc = acc + p.float()
    if delta is not None:
        acc = acc + delta.float()
    return acc.to(dtype_of(kp.residual_dtype))


def fused_qk_norm_rope(
    x_LHD: torch.Tensor, weight: torch.Tensor, eps: float, cos, sin, kp: KernelPolicy
) -> torch.Tensor:
    """QK-norm and RoPE in one float32 pass: no rounding between the norm and the rotation."""
    x = x_LHD.float()
    x_n = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight.float()
    ns = type("KP", (), {"rope_dtype": "float32"})
    return apply_rope(x_n, cos, sin, ns).to(x_LHD.dtype)


def other_chunk_attention(
    q, k, v, q_positions, kp: KernelPolicy, *, kv_chunk: int = 16, **kw
) -> torch.Tensor:
    """The contract attention with another KV chunk (a split-KV tiling change)."""
    return chunked_attention(q, k, v, q_positions, kp, kv_chunk=kv_chunk, **kw)


def sdpa_attention(q_LHD, k_SKD, v_SKD, q_positions, kp: KernelPolicy, **kw) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` (GEMM-based, shape-dependent order); one sequence."""
    rep = q_LHD.shape[1] // k_SKD.shape[1]
    q = q_LHD.transpose(0, 1)
    k = k_SKD.repeat_interleave(rep, dim=1).transpose(0, 1).to(q.dtype)
    v = v_SKD.repeat_interleave(rep, dim=1).transpose(0, 1).to(q.dtype)
    mask = torch.arange(k.shape[1], device=q.device)[None, :] <= q_positions.to(q.device)[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(0, 1)


def stock_token_logprobs(
    logits_TV: torch.Tensor,
    token_ids_T: torch.Tensor,
    kp: KernelPolicy,
    vocab_size: int,
    *,
    dtype="float32",
) -> torch.Tensor:
    """``torch.log_softmax`` in another dtype (e.g. float32 where the contract says bfloat16)."""
    lp = torch.log_softmax(logits_TV[..., :vocab_size].to(dtype_of(dtype)), dim=-1)
    return lp.gather(-1, token_ids_T.long()[:, None])[:, 0]
