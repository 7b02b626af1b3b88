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

import importlib
import math
from functools import cache

import torch
import torch.nn.functional as F

from ._dtypes import dtype_of
from .policy import KernelPolicy
from .reduce import fixed_sum
from .registry import backend_for, kernel

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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Online softmax over the KV chunks ``0 .. max(pos) // chunk`` (later chunks are causally
    empty for every query of the block, so they are skipped). Returns the output and the
    log-sum-exp of every (query, head) in ``sd``."""
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
    return (acc_LHD / l_LH[..., None]).to(q_LHD.dtype), m_LH + torch.log(l_LH)


def _attend_one(
    q_LHD: torch.Tensor,
    k_SKD: torch.Tensor,
    v_SKD: torch.Tensor,
    pos_L: torch.Tensor,
    chunk: int,
    sd: torch.dtype,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, in query blocks of bounded working memory (prefill and decode alike):
    ``(o_LHD, lse_LH)``."""
    L, H, D = q_LHD.shape
    block = max(1, _BLOCK_ELEMENTS // (H * chunk * D))
    pos_L = pos_L.to(q_LHD.device)
    outs = [
        _attend_block(q_LHD[i : i + block], k_SKD, v_SKD, pos_L[i : i + block], chunk, sd, scale)
        for i in range(0, L, block)
    ]
    if len(outs) == 1:
        return outs[0]
    return torch.cat([o for o, _ in outs]), torch.cat([lse for _, lse in outs])


def key_rows(cu_seqlens_k, k_starts, n: int) -> list[tuple[int, int]]:
    """``(first key row, key count)`` of each of ``n`` sequences: the counts from
    ``cu_seqlens_k``; the rows follow each other unless ``k_starts`` places each sequence's keys
    (a KV pool where every request owns a region: ``k_starts[i]`` is its first row)."""
    cu_k = [int(c) for c in cu_seqlens_k.tolist()]
    if len(cu_k) != n + 1:
        raise ValueError(f"cu_seqlens_q has {n + 1} entries, cu_seqlens_k {len(cu_k)}")
    starts = cu_k[:-1] if k_starts is None else [int(s) for s in k_starts.tolist()]
    if len(starts) != n:
        raise ValueError(f"k_starts has {len(starts)} entries for {n} sequences")
    return [(starts[i], cu_k[i + 1] - cu_k[i]) for i in range(n)]


def _sequences(cu_seqlens_q, cu_seqlens_k, total_q: int, total_k: int, k_starts=None):
    """``(query rows, key rows)`` slices of every sequence of a pack (one without cu_seqlens)."""
    if cu_seqlens_q is None:
        return [(slice(0, total_q), slice(0, total_k))]
    cu_q = cu_seqlens_q.tolist()
    keys = key_rows(cu_seqlens_k, k_starts, len(cu_q) - 1)
    return [(slice(cu_q[i], cu_q[i + 1]), slice(k0, k0 + n)) for i, (k0, n) in enumerate(keys)]


def reference_attention_lse(
    q_LHD: torch.Tensor,
    k_SKD: torch.Tensor,
    v_SKD: torch.Tensor,
    q_positions: torch.Tensor,
    kp: KernelPolicy,
    *,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    scale: float | None = None,
    kv_chunk: int | None = None,
    k_starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o_LHD, lse_LH)``: ``reference_attention``'s output and the log-sum-exp of every
    (query, head) row in ``kp.attention_softmax_dtype`` (what a backward needs besides ``o``)."""
    chunk = kv_chunk or kp.attention_kv_chunk
    sd = dtype_of(kp.attention_softmax_dtype)
    scale = q_LHD.shape[-1] ** -0.5 if scale is None else scale
    o_LHD = q_LHD.new_zeros(q_LHD.shape)
    lse_LH = torch.full(q_LHD.shape[:2], -math.inf, dtype=sd, device=q_LHD.device)
    seqs = _sequences(cu_seqlens_q, cu_seqlens_k, q_LHD.shape[0], k_SKD.shape[0], k_starts)
    for qs, ks in seqs:
        if qs.stop > qs.start:
            o_LHD[qs], lse_LH[qs] = _attend_one(
                q_LHD[qs], k_SKD[ks], v_SKD[ks], q_positions[qs], chunk, sd, scale
            )
    return o_LHD, lse_LH


def reference_attention(
    q_LHD: torch.Tensor,
    k_SKD: torch.Tensor,
    v_SKD: torch.Tensor,
    q_positions: torch.Tensor,
    kp: KernelPolicy,
    *,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    scale: float | None = None,
    kv_chunk: int | None = None,
    k_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """The PyTorch backend of ``chunked_attention`` (CPU reference; any device).

    ``k``/``v`` hold keys at absolute positions ``0..S-1``; query ``i`` sees keys ``<= q_positions[i]``.
    ``kv_chunk`` overrides ``kp.attention_kv_chunk`` (used by the stock variant).
    """
    kw = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, scale=scale, kv_chunk=kv_chunk)
    return reference_attention_lse(q_LHD, k_SKD, v_SKD, q_positions, kp, k_starts=k_starts, **kw)[0]


def _backward_one(q, k, v, o, lse, do, pos, scale, md):
    """One sequence's ``(dq, dk, dv)`` in ``md`` from the saved output and log-sum-exp, in query
    blocks of bounded memory; a block reads keys ``0 .. max(pos)`` only (causal)."""
    L, H, D = q.shape
    S, KVH = k.shape[:2]
    rep = H // KVH
    dq = torch.zeros(L, H, D, dtype=md, device=q.device)
    dk = torch.zeros(S, KVH, D, dtype=md, device=q.device)
    dv = torch.zeros(S, KVH, D, dtype=md, device=q.device)
    block = max(1, _BLOCK_ELEMENTS // (H * max(S, 1)))
    for i in range(0, L, block):
        rows = slice(i, min(i + block, L))
        p_B = pos[rows]
        n = int(p_B.max()) + 1
        q_B = q[rows].to(md).reshape(-1, KVH, rep, D)
        do_B = do[rows].to(md).reshape(-1, KVH, rep, D)
        k_S, v_S = k[:n].to(md), v[:n].to(md)
        visible = (torch.arange(n, device=q.device)[None, :] <= p_B[:, None])[:, None, None, :]
        s = torch.einsum("bgrd,sgd->bgrs", q_B, k_S) * scale
        lse_B = lse[rows].to(md).reshape(-1, KVH, rep, 1)
        p = torch.where(visible, torch.exp(s - lse_B), torch.zeros((), dtype=md, device=q.device))
        delta = (do_B * o[rows].to(md).reshape(-1, KVH, rep, D)).sum(-1, keepdim=True)
        ds = p * (torch.einsum("bgrd,sgd->bgrs", do_B, v_S) - delta)
        dv[:n] += torch.einsum("bgrs,bgrd->sgd", p, do_B)
        dk[:n] += torch.einsum("bgrs,bgrd->sgd", ds, q_B) * scale
        dq[rows] = (torch.einsum("bgrs,sgd->bgrd", ds, k_S) * scale).reshape(-1, H, D)
    return dq, dk, dv


def reference_attention_backward(
    q_LHD: torch.Tensor,
    k_SKD: torch.Tensor,
    v_SKD: torch.Tensor,
    o_LHD: torch.Tensor,
    lse_LH: torch.Tensor,
    do_LHD: torch.Tensor,
    q_positions: torch.Tensor,
    kp: KernelPolicy = None,
    *,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    scale: float | None = None,
    kv_chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of causal attention from its saved output and log-sum-exp (FlashAttention's
    backward: ``P = exp(S - lse)`` on visible keys, ``dV = Pᵀ dO``, ``dS = P ∘ (dO Vᵀ - rowsum(dO ∘ O))``,
    ``dQ = dS K · scale``, ``dK = dSᵀ Q · scale``), in ``q``'s dtype promoted to at least float32,
    returned in the input dtypes. The same packing arguments as ``chunked_attention``; the forward's
    KV chunking does not enter the gradient formulas (``kp``/``kv_chunk`` are accepted for a
    uniform signature). Memory is bounded by query blocks, never ``[L, S]`` for a whole pack."""
    del kp, kv_chunk
    md = torch.promote_types(q_LHD.dtype, torch.float32)
    scale = q_LHD.shape[-1] ** -0.5 if scale is None else scale
    dq = torch.zeros(q_LHD.shape, dtype=md, device=q_LHD.device)
    dk = torch.zeros(k_SKD.shape, dtype=md, device=q_LHD.device)
    dv = torch.zeros(v_SKD.shape, dtype=md, device=q_LHD.device)
    pos = q_positions.to(q_LHD.device)
    for qs, ks in _sequences(cu_seqlens_q, cu_seqlens_k, q_LHD.shape[0], k_SKD.shape[0]):
        if qs.stop > qs.start:
            dq[qs], dk_s, dv_s = _backward_one(
                q_LHD[qs], k_SKD[ks], v_SKD[ks], o_LHD[qs], lse_LH[qs], do_LHD[qs], pos[qs],
                scale, md,
            )  # fmt: skip
            dk[ks] += dk_s
            dv[ks] += dv_s
    return dq.to(q_LHD.dtype), dk.to(k_SKD.dtype), dv.to(v_SKD.dtype)


def chunked_attention(
    q_LHD: torch.Tensor,
    k_SKD: torch.Tensor,
    v_SKD: torch.Tensor,
    q_positions: torch.Tensor,
    kp: KernelPolicy,
    *,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    scale: float | None = None,
    kv_chunk: int | None = None,
    k_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention ``o_LHD`` (dtype of ``q``); see the module docstring for the contract.

    ``k``/``v`` hold keys at absolute positions ``0..S-1``; query ``i`` sees keys ``<= q_positions[i]``.
    ``kv_chunk`` overrides ``kp.attention_kv_chunk`` (used by the stock variant). ``k_starts``
    (with ``cu_seqlens``) places sequence ``i``'s keys at rows ``k_starts[i] ..`` of ``k``/``v``
    instead of right after sequence ``i - 1``'s (a KV pool; the bits are the same). Runs the
    backend the registry names for ``q``'s device.
    """
    impl = kernel("chunked_attention", q_LHD.device)
    kw = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, scale=scale, kv_chunk=kv_chunk)
    if k_starts is not None:  # only the backends take it (the stock twins do not)
        kw["k_starts"] = k_starts
    return impl(q_LHD, k_SKD, v_SKD, q_positions, kp, **kw)


def chunked_attention_lse(
    q_LHD, k_SKD, v_SKD, q_positions, kp: KernelPolicy, *, cu_seqlens_q=None, cu_seqlens_k=None, scale=None,
    kv_chunk=None,
):  # fmt: skip
    """``(o_LHD, lse_LH)``: ``chunked_attention``'s output (the same bits) and the log-sum-exp of
    every (query, head) row, what ``attention_backward`` needs; the registry's backend."""
    impl = kernel("chunked_attention_lse", q_LHD.device)
    kw = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, scale=scale, kv_chunk=kv_chunk)
    return impl(q_LHD, k_SKD, v_SKD, q_positions, kp, **kw)


def attention_backward(
    q_LHD, k_SKD, v_SKD, o_LHD, lse_LH, do_LHD, q_positions, kp: KernelPolicy, *, cu_seqlens_q=None,
    cu_seqlens_k=None, scale=None, kv_chunk=None,
):  # fmt: skip
    """``(dq, dk, dv)`` from ``chunked_attention_lse``'s saved ``o`` and ``lse``; the registry's
    backend (see ``reference_attention_backward`` for the formulas)."""
    impl = kernel("attention_backward", q_LHD.device)
    kw = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, scale=scale, kv_chunk=kv_chunk)
    return impl(q_LHD, k_SKD, v_SKD, o_LHD, lse_LH, do_LHD, q_positions, kp, **kw)


# ---- decode with static shapes (a CUDA graph's step) --------------------------------------------
def reference_decode_attention(
    q_BHD: torch.Tensor,
    k_SKD: torch.Tensor,
    v_SKD: torch.Tensor,
    positions_B: torch.Tensor,
    k_starts_B: torch.Tensor,
    kp: KernelPolicy,
    *,
    max_keys: int,
    scale: float | None = None,
    kv_chunk: int | None = None,
) -> torch.Tensor:
    """One query per sequence: query ``b`` at absolute position ``positions[b]`` against its keys
    at rows ``k_starts[b] + 0 .. positions[b]`` of ``k``/``v`` (a KV pool), with no value read on
    the host: the loop runs a fixed ``ceil(max_keys / chunk)`` chunks whatever the positions.
    Per query it is ``reference_attention``'s computation: the same chunks at absolute positions
    in the same order, keys past the query zeroed as its zero padding is, and chunks after the
    position leaving the state untouched (``torch.where``), so the bits are ``chunked_attention``'s
    for that query and its keys. Every step is elementwise or a ``fixed_sum`` over a row's own
    values, so the batch (and its padding rows) changes no row's bits."""
    chunk = kv_chunk or kp.attention_kv_chunk
    sd = dtype_of(kp.attention_softmax_dtype)
    B, H, D = q_BHD.shape
    S, KVH = k_SKD.shape[:2]
    rep = H // KVH
    scale = D**-0.5 if scale is None else scale
    dev = q_BHD.device
    pos_B, k0_B = positions_B.to(dev), k_starts_B.to(dev)
    q_BH1D = q_BHD.to(sd)[:, :, None, :]
    m_BH = torch.full((B, H), -math.inf, dtype=sd, device=dev)
    l_BH = torch.zeros((B, H), dtype=sd, device=dev)
    acc_BHD = torch.zeros((B, H, D), dtype=sd, device=dev)
    offs_C = torch.arange(chunk, device=dev)
    for c in range(max(1, math.ceil(max_keys / chunk))):
        lo = c * chunk
        seen_BC = (lo + offs_C)[None, :] <= pos_B[:, None]  # the query's keys; past them: zeros
        rows_BC = torch.where(seen_BC, k0_B[:, None] + lo + offs_C[None, :], 0).clamp(max=S - 1)
        zero = torch.zeros((), dtype=k_SKD.dtype, device=dev)
        kc_BCKD = torch.where(seen_BC[:, :, None, None], k_SKD[rows_BC], zero)
        vc_BCKD = torch.where(seen_BC[:, :, None, None], v_SKD[rows_BC], zero)
        # GQA: query head h reads kv head h // rep (HF repeat_kv), as reference_attention does
        kc_BHCD = kc_BCKD.to(sd).repeat_interleave(rep, dim=2).permute(0, 2, 1, 3).contiguous()
        vc_BHDC = vc_BCKD.to(sd).repeat_interleave(rep, dim=2).permute(0, 2, 3, 1).contiguous()
        s_BHC = fixed_sum(q_BH1D * kc_BHCD) * scale
        s_BHC = torch.where(seen_BC[:, None, :], s_BHC, -math.inf)
        m_new = torch.maximum(m_BH, s_BHC.amax(-1))
        alpha = torch.exp(m_BH - m_new)
        p_BHC = torch.exp(s_BHC - m_new[..., None])
        l_new = l_BH * alpha + fixed_sum(p_BHC)
        acc_new = acc_BHD * alpha[..., None] + fixed_sum(p_BHC[:, :, None, :] * vc_BHDC)
        active_B = pos_B >= lo
        m_BH = torch.where(active_B[:, None], m_new, m_BH)
        l_BH = torch.where(active_B[:, None], l_new, l_BH)
        acc_BHD = torch.where(active_B[:, None, None], acc_new, acc_BHD)
    return (acc_BHD / l_BH[..., None]).to(q_BHD.dtype)


# backend -> the decode variant (lazy, as ``registry.BACKENDS``: the torch one never imports triton)
DECODE_BACKENDS: dict[str, str] = {
    "torch": "contractgen.adapters.kernels.attention:reference_decode_attention",
    "triton": "contractgen.adapters.kernels.triton.attention:triton_decode_attention",
}


def decode_attention(
    q_BHD: torch.Tensor,
    k_SKD: torch.Tensor,
    v_SKD: torch.Tensor,
    positions_B: torch.Tensor,
    k_starts_B: torch.Tensor,
    kp: KernelPolicy,
    *,
    max_keys: int,
    scale: float | None = None,
    kv_chunk: int | None = None,
) -> torch.Tensor:
    """``chunked_attention`` of one query per sequence (``o_BHD``, the same bits) whose launch
    never depends on a value read on the host: the positions and key rows stay on the device, and
    ``max_keys`` (the most keys any query may see) fixes the work. What a captured CUDA graph
    replays (``adapters/sglang/decode_graph.py``). Runs the backend the registry names for
    ``q``'s device (``registry.backend_for``)."""
    impl = _decode_impl(backend_for(q_BHD.device))
    return impl(
        q_BHD, k_SKD, v_SKD, positions_B, k_starts_B, kp, max_keys=max_keys, scale=scale,
        kv_chunk=kv_chunk,
    )  # fmt: skip


@cache
def _decode_impl(backend: str):
    module, _, attr = DECODE_BACKENDS[backend].partition(":")
    return getattr(importlib.import_module(module), attr)
