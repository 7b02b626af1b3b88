"""Causal GQA attention with a fixed KV-chunk order and an online softmax.

For one query at absolute position ``p`` the computation is a fixed function of ``q`` and keys
``0..p``: KV chunks of ``kp.attention_kv_chunk`` positions starting at absolute position 0, visited in
order; every chunk is reduced over its full width (keys past the end are zero-padded and masked, so
the reduction length never changes); chunks wholly after ``p`` leave the state untouched
(``torch.where``, not arithmetic). Scores, running max/sum and the output accumulator are in
``kp.attention_softmax_dtype``. q·k and p·v are elementwise products reduced over a contiguous last
dim of fixed length with ``fixed_sum`` (no GEMM or ``torch.sum`` whose order could depend on the
batch shape or the device). Hence the same bits in a
full-sequence forward, a prefill of another length, or one decode step against a KV cache.

Packed sequences: pass ``cu_seqlens_q`` / ``cu_seqlens_k`` (cumulative lengths, ``[0, ..., total]``);
sequence ``i`` is ``q[cu_q[i]:cu_q[i+1]]`` against ``k/v[cu_k[i]:cu_k[i+1]]`` whose rows hold absolute
positions ``0..len-1``; ``q_positions`` is packed the same way (absolute, per sequence).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._dtypes import dtype_of
from .reduce import fixed_sum
from .registry import kernel

# Elements of one ``[queries, heads, chunk, head_dim]`` product tensor: query blocks are sized so
# that attention's working memory stays bounded at any sequence length (a row's bits do not depend
# on the block it is computed in: every step is elementwise or a reduction over its own row).
_BLOCK_ELEMENTS = 1 << 24


def _kv_chunk_SKD(t_SKD: torch.Tensor, lo: int, chunk: int) -> torch.Tensor:
    """Rows ``lo .. lo+chunk-1`` of ``t``, zero padded past its end."""
    c = t_SKD[lo : lo + chunk]
    return F.pad(c, (0, 0, 0, 0, 0, chunk - c.shape[0])) if c.shape[0] < chunk else c


def _attend_block(
    q_LHD: torch.Tensor,
    k_SKD: torch.Tensor,
    v_SKD: torch.Tensor,
    pos_L: torch.Tensor,
    chunk: int,
    sd: torch.dtype,
    scale: float,
) -> torch.Tensor:
    """Online softmax over the KV chunks ``0 .. max(pos) // chunk`` (later chunks are causally
    empty for every query of the block, so they are skipped)."""
    L, H, D = q_LHD.shape
    rep = H // k_SKD.shape[1]
    dev = q_LHD.device
    q_LH1D = q_LHD.to(sd)[:, :, None, :]
    m_LH = torch.full((L, H), -math.inf, dtype=sd, device=dev)
    l_LH = torch.zeros((L, H), dtype=sd, device=dev)
    acc_LHD = torch.zeros((L, H, D), dtype=sd, device=dev)
    offs = torch.arange(chunk, device=dev)
    for c in range(int(pos_L.max().item()) // chunk + 1):
        lo = c * chunk
        # GQA: query head h reads kv head h // rep (HF repeat_kv).
        kc_HCD = _kv_chunk_SKD(k_SKD, lo, chunk).to(sd).repeat_interleave(rep, dim=1)
        vc_HDC = _kv_chunk_SKD(v_SKD, lo, chunk).to(sd).repeat_interleave(rep, dim=1)
        kc_HCD, vc_HDC = kc_HCD.permute(1, 0, 2).contiguous(), vc_HDC.permute(1, 2, 0).contiguous()
        s_LHC = fixed_sum(q_LH1D * kc_HCD[None]) * scale
        valid_LC = (lo + offs)[None, :] <= pos_L[:, None]
        s_LHC = torch.where(valid_LC[:, None, :], s_LHC, -math.inf)
        m_new = torch.maximum(m_LH, s_LHC.amax(-1))
        alpha = torch.exp(m_LH - m_new)
        p_LHC = torch.exp(s_LHC - m_new[..., None])
        l_new = l_LH * alpha + fixed_sum(p_LHC)
        acc_new = acc_LHD * alpha[..., None] + fixed_sum(p_LHC[:, :, None, :] * vc_HDC[None])
        active_L = pos_L >= lo
        m_LH = torch.where(active_L[:, None], m_new, m_LH)
        l_LH = torch.where(active_L[:, None], l_new, l_LH)
        acc_LHD = torch.where(active_L[:, None, None], acc_new, acc_LHD)
    return (acc_LHD / l_LH[..., None]).to(q_LHD.dtype)


def _attend_one(
    q_LHD: torch.Tensor,
    k_SKD: torch.Tensor,
    v_SKD: torch.Tensor,
    pos_L: torch.Tensor,
    chunk: int,
    sd: torch.dtype,
    scale: float,
) -> torch.Tensor:
    """One sequence, in query blocks of bounded working memory (prefill and decode alike)."""
    L, H, D = q_LHD.shape
    block = max(1, _BLOCK_ELEMENTS // (H * chunk * D))
    pos_L = pos_L.to(q_LHD.device)
    outs = [
        _attend_block(q_LHD[i : i + block], k_SKD, v_SKD, pos_L[i : i + block], chunk, sd, scale)
        for i in range(0, L, block)
    ]
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def reference_attention(
    q_LHD: torch.Tensor,
    k_SKD: torch.Tensor,
    v_SKD: torch.Tensor,
    q_positions: torch.Tensor,
    kp,
    *,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    scale: float | None = None,
    kv_chunk: int | None = None,
) -> torch.Tensor:
    """The PyTorch backend of ``chunked_attention`` (CPU reference; any device).

    ``k``/``v`` hold keys at absolute positions ``0..S-1``; query ``i`` sees keys ``<= q_positions[i]``.
    ``kv_chunk`` overrides ``kp.attention_kv_chunk`` (used by the stock variant).
    """
    chunk = kv_chunk or kp.attention_kv_chunk
    sd = dtype_of(kp.attention_softmax_dtype)
    scale = q_LHD.shape[-1] ** -0.5 if scale is None else scale
    if cu_seqlens_q is None:
        return _attend_one(q_LHD, k_SKD, v_SKD, q_positions, chunk, sd, scale)
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    if len(cu_q) != len(cu_k):
        raise ValueError(f"cu_seqlens_q has {len(cu_q)} entries, cu_seqlens_k {len(cu_k)}")
    outs = []
    for i in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        if qs.stop > qs.start:
            outs.append(
                _attend_one(q_LHD[qs], k_SKD[ks], v_SKD[ks], q_positions[qs], chunk, sd, scale)
            )
    return torch.cat(outs) if outs else q_LHD.new_zeros(q_LHD.shape)


def chunked_attention(
    q_LHD: torch.Tensor,
    k_SKD: torch.Tensor,
    v_SKD: torch.Tensor,
    q_positions: torch.Tensor,
    kp,
    *,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    scale: float | None = None,
    kv_chunk: int | None = None,
) -> torch.Tensor:
    """Causal attention ``o_LHD`` (dtype of ``q``); see the module docstring for the contract.

    ``k``/``v`` hold keys at absolute positions ``0..S-1``; query ``i`` sees keys ``<= q_positions[i]``.
    ``kv_chunk`` overrides ``kp.attention_kv_chunk`` (used by the stock variant). Runs the backend
    the registry names for ``q``'s device.
    """
    impl = kernel("chunked_attention", q_LHD.device)
    return impl(
        q_LHD,
        k_SKD,
        v_SKD,
        q_positions,
        kp,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        scale=scale,
        kv_chunk=kv_chunk,
    )
