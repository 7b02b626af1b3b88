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

from ._dtypes import dtype_of
from .reduce import fixed_sum


def _attend_one(
    q_LHD: torch.Tensor,
    k_SKD: torch.Tensor,
    v_SKD: torch.Tensor,
    pos_L: torch.Tensor,
    chunk: int,
    sd: torch.dtype,
    scale: float,
) -> torch.Tensor:
    L, H, D = q_LHD.shape
    S, KVH = k_SKD.shape[0], k_SKD.shape[1]
    rep = H // KVH
    n_chunks = int(pos_L.max().item()) // chunk + 1
    if n_chunks * chunk > S:
        pad = n_chunks * chunk - S
        k_SKD = torch.cat([k_SKD, k_SKD.new_zeros(pad, KVH, D)])
        v_SKD = torch.cat([v_SKD, v_SKD.new_zeros(pad, KVH, D)])
    # GQA: query head h reads kv head h // rep (HF repeat_kv).
    k_HSD = k_SKD.to(sd).repeat_interleave(rep, dim=1).permute(1, 0, 2)
    v_HDS = v_SKD.to(sd).repeat_interleave(rep, dim=1).permute(1, 2, 0)
    q_LH1D = q_LHD.to(sd)[:, :, None, :]
    dev = q_LHD.device
    pos_L = pos_L.to(dev)
    m_LH = torch.full((L, H), -math.inf, dtype=sd, device=dev)
    l_LH = torch.zeros((L, H), dtype=sd, device=dev)
    acc_LHD = torch.zeros((L, H, D), dtype=sd, device=dev)
    offs = torch.arange(chunk, device=dev)
    for c in range(n_chunks):
        lo = c * chunk
        kc_HCD = k_HSD[:, lo : lo + chunk, :].contiguous()
        vc_HDC = v_HDS[:, :, lo : lo + chunk].contiguous()
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
