"""Triton causal GQA attention over the contract's fixed KV chunks (flash-style).

One program per (block of query rows of one sequence, group of query heads sharing a KV head):
a tile of ``BLOCK_Q`` rows, each one (query, head) pair. Prefill puts one head in a tile;
decode and short chunks put several (``head_group``), so a KV head's keys are streamed once for
all its query heads. The program visits the KV chunks of ``kp.attention_kv_chunk`` keys from
absolute position 0 in order, up to the chunk that holds the block's last position (later chunks
are causally empty: skipped). Per chunk: scores ``q k^T`` as one tensor-core dot (bf16 operands,
float32 accumulate) times the scale (in log2 units), keys past a query's position masked to
-inf, online softmax in float32 on exp2 (``m``, ``l_sum``, ``acc``), ``p`` rounded to ``v``'s dtype
for the ``p v`` dot (as FA3 does), float32 accumulate. A chunk that is wholly after a query's
position leaves its state exactly unchanged (``alpha = 1``, ``p = 0``), so a row's bits depend
only on its own query, its position and the keys, not on its place in the tile: prefill of any
length, packed sequences and one decode step against a KV cache give the same bits (the tile
shape never changes). Also returns the natural log-sum-exp per (query, head), for a backward
from the saved output.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .._dtypes import dtype_of
from ..attention import (
    key_rows,
    reference_attention,
    reference_attention_lse,
    reference_decode_attention,
)
from ..policy import KernelPolicy
from .arith import INTERPRET, _round, interpreter_dot
from .matmul import descriptor_fits

# One launch shape for every call: the fastest of benchmarks/tune_attention.py's sweep on an H200
# timing the kernels alone (``--kernel-time``, 2026-12-02, BENCHMARKS.md) at 1 x 4096, 1 x 16384
# and 32 x 512 tokens. 128 query rows gave the same bits (a row's bits do not depend on the tile's
# height: ``test_triton_attention_tile_height_keeps_bits``) and were not faster; 8 warps were
# slower everywhere (two 4-warp programs fit on an SM, one 8-warp program did).
BLOCK_Q = 64
NUM_WARPS = 4
NUM_STAGES = 3
# Chunks every row of a block sees whole run without the causal and key masks (the same values).
WHOLE_CHUNKS = True
# Query heads sharing a tile (``head_group``); 1 turns grouping off (the same bits).
GROUP_HEADS = True
# k and v through TMA descriptors where they fit (``kv_descriptors_fit``); the same bits. Off:
# on the H200 (2026-12-02) pointer loads were faster at 4k prefill, and decode was too noisy to
# call (BENCHMARKS.md).
TMA_KV = False
# Scores are scaled into log2 units so the softmax runs on exp2 (one multiply fewer per score;
# Triton lowers exp to exp2 of a product anyway); the log-sum-exp is returned in natural log.
LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)  # read inside the kernel: a compile-time constant


@triton.jit
def _dot(a, b):
    if INTERPRET:  # row-position independent, as on the GPU (``interpreter_dot``)
        return interpreter_dot(a, b)
    return tl.dot(a, b)


@triton.jit
def _kv_rows(
    k_ptr, v_ptr, k0, kpos, klen, kvh, sk, skh, sv, svh, D: tl.constexpr, MASK: tl.constexpr
):  # fmt: skip
    """k and v of KV head ``kvh`` at key positions ``kpos`` of a sequence whose keys start at
    row ``k0``. ``MASK``: positions at or past ``klen`` load as zeros (without it, every
    position must be inside the keys)."""
    offs_d = tl.arange(0, D)
    k_at = k_ptr + (k0 + kpos)[:, None] * sk + kvh * skh + offs_d[None, :]
    v_at = v_ptr + (k0 + kpos)[:, None] * sv + kvh * svh + offs_d[None, :]
    if MASK:
        inside = (kpos < klen)[:, None]
        return tl.load(k_at, mask=inside, other=0.0), tl.load(v_at, mask=inside, other=0.0)
    return tl.load(k_at), tl.load(v_at)


@triton.jit
def _chunk(
    q, k_ptr, v_ptr, k_desc, v_desc, k0, klen, pos, m, l_sum, acc, c, kvh, sk, skh, sv, svh,
    scale, CHUNK: tl.constexpr, D: tl.constexpr, MASK: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """One KV chunk into the online softmax. ``MASK=False`` for a chunk every row of the block
    sees whole (inside the keys, at or before every row's position): the masks would keep every
    value, so leaving them out changes no bit. ``TMA``: k and v come in through descriptors of
    ``[keys, kv_heads * D]``; rows past the sequence's keys are then whatever the buffer holds
    (the next sequence, an unwritten cache slot), so masked chunks zero those rows of ``v`` as
    the masked loads do (their ``p`` is 0, but 0 x NaN is not)."""
    offs_k = c * CHUNK + tl.arange(0, CHUNK)
    if TMA:
        k = k_desc.load([k0 + c * CHUNK, kvh * D])
        v = v_desc.load([k0 + c * CHUNK, kvh * D])
        if MASK:
            v = tl.where((offs_k < klen)[:, None], v, 0.0)
    else:
        k, v = _kv_rows(k_ptr, v_ptr, k0, offs_k, klen, kvh, sk, skh, sv, svh, D, MASK)
    qk = _dot(q, tl.trans(k))  # scores in log2 units once scaled: the scale carries log2(e)
    # ``p = exp2(qk * scale - m)`` is one explicit fused multiply-add in both paths. Left to the
    # compiler, the unmasked path contracted it into an FMA and the masked one (a select between
    # the multiply and the subtract) did not: a row's log-sum-exp then changed by an ulp with the
    # chunks its block saw whole (H200, 2026-12-02), and its output could follow.
    if MASK:
        seen = offs_k[None, :] <= pos[:, None]
        m_new = tl.maximum(m, tl.max(tl.where(seen, qk * scale, -float("inf")), 1))
        p = tl.where(seen, tl.exp2(tl.fma(qk, scale, -m_new[:, None])), 0.0)
    else:
        m_new = tl.maximum(m, tl.max(qk * scale, 1))
        p = tl.exp2(tl.fma(qk, scale, -m_new[:, None]))
    alpha = tl.exp2(m - m_new)
    l_sum = l_sum * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(_round(p, v.dtype), v)
    return m_new, l_sum, acc


@triton.jit
def _attn_fwd(
    q_ptr, k_ptr, v_ptr, k_desc, v_desc, o_ptr, lse_ptr, pos_ptr, blk_ptr,
    sq, sqh, sk, skh, sv, svh, so, soh, slse, scale,
    REP: tl.constexpr, GROUP: tl.constexpr, CHUNK: tl.constexpr, D: tl.constexpr,
    BLOCK_Q: tl.constexpr, MAX_CHUNKS: tl.constexpr, WHOLE: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h0 = tl.program_id(1) * GROUP  # the tile's first query head; its GROUP heads share a KV head
    kvh = h0 // REP
    q0 = tl.load(blk_ptr + 4 * b)
    q1 = tl.load(blk_ptr + 4 * b + 1)
    k0 = tl.load(blk_ptr + 4 * b + 2)
    klen = tl.load(blk_ptr + 4 * b + 3)
    rows = tl.arange(0, BLOCK_Q)  # tile row r: query q0 + r // GROUP of head h0 + r % GROUP
    offs_q = q0 + rows // GROUP
    h = h0 + rows % GROUP
    offs_d = tl.arange(0, D)
    qmask = offs_q < q1  # a block holds BLOCK_Q // GROUP queries: rows past them are past q1
    pos = tl.load(pos_ptr + offs_q, mask=qmask, other=0)
    q = tl.load(
        q_ptr + offs_q[:, None] * sq + h[:, None] * sqh + offs_d[None, :],
        mask=qmask[:, None],
        other=0.0,
    )
    m = tl.full((BLOCK_Q,), -float("inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_Q,), tl.float32)
    acc = tl.zeros((BLOCK_Q, D), tl.float32)
    last = tl.max(pos, 0) // CHUNK
    # chunks [0, whole) are seen whole by every row: before the lowest row's position, in the keys
    lowest = tl.min(tl.where(qmask, pos, 2147483647), 0)
    whole = tl.minimum((lowest + 1) // CHUNK, klen // CHUNK) if WHOLE else 0
    if INTERPRET:  # the interpreter loops only to compile-time bounds
        for c in range(MAX_CHUNKS):
            if c < whole:
                m, l_sum, acc = _chunk(
                    q, k_ptr, v_ptr, k_desc, v_desc, k0, klen, pos, m, l_sum, acc, c, kvh, sk,
                    skh, sv, svh, scale, CHUNK, D, False, TMA,
                )  # fmt: skip
            elif c <= last:
                m, l_sum, acc = _chunk(
                    q, k_ptr, v_ptr, k_desc, v_desc, k0, klen, pos, m, l_sum, acc, c, kvh, sk,
                    skh, sv, svh, scale, CHUNK, D, True, TMA,
                )  # fmt: skip
    else:
        for c in range(0, whole):
            m, l_sum, acc = _chunk(
                q, k_ptr, v_ptr, k_desc, v_desc, k0, klen, pos, m, l_sum, acc, c, kvh, sk, skh,
                sv, svh, scale, CHUNK, D, False, TMA,
            )  # fmt: skip
        for c in range(whole, last + 1):
            m, l_sum, acc = _chunk(
                q, k_ptr, v_ptr, k_desc, v_desc, k0, klen, pos, m, l_sum, acc, c, kvh, sk, skh,
                sv, svh, scale, CHUNK, D, True, TMA,
            )  # fmt: skip
    o = acc / l_sum[:, None]
    tl.store(
        o_ptr + offs_q[:, None] * so + h[:, None] * soh + offs_d[None, :],
        _round(o, o_ptr.dtype.element_ty),
        mask=qmask[:, None],
    )
    tl.store(lse_ptr + offs_q * slse + h, (m + tl.log2(l_sum)) * LN2, mask=qmask)


@functools.lru_cache(maxsize=64)
def _block_table(cu_q: tuple, keys: tuple, rows: int, device: torch.device) -> torch.Tensor:
    """``_blocks`` kept per pack: the layers of one step (28 in Qwen3-0.6B) share one table, so
    only the first copies it to the device. The copy from pageable memory waits for the stream:
    once per layer, it kept the host from running ahead of the GPU. The kernels only read it."""
    return _blocks(list(cu_q), list(keys), rows, device)


def _blocks(cu_q: list[int], keys: list[tuple[int, int]], rows: int, device) -> torch.Tensor:
    """``rows`` query rows ``[q0, q1)`` of one sequence per program, with that sequence's first key
    row and key count: ``[num_blocks, 4]`` int32. The blocks that see the most keys come first
    (the queries are the last rows of their keys), so the longest programs start in the first
    wave instead of trailing the last; the order changes no bit."""
    seen = {}  # block -> keys its last row sees (its sequence's keys, less the queries after it)
    for i, (k0, n) in enumerate(keys):
        for q in range(cu_q[i], cu_q[i + 1], rows):
            q1 = min(q + rows, cu_q[i + 1])
            seen[(q, q1, k0, n)] = n - (cu_q[i + 1] - q1)
    blocks = sorted(seen, key=lambda blk: -seen[blk])
    return torch.tensor(blocks, dtype=torch.int32, device=device).reshape(-1, 4)


def outside_rows(cu_q: list[int], rows: int) -> list[slice]:
    """The query rows no sequence of ``cu_q`` holds (before its first offset, from its last):
    no program writes them, so the caller fills them. Usually none."""
    return [s for s in (slice(0, cu_q[0]), slice(cu_q[-1], rows)) if s.start < s.stop]


def head_group(rep: int, longest_queries: int) -> int:
    """How many query heads of one KV head (``rep`` of them) share a tile: the most, a divisor of
    ``rep``, whose rows of one sequence fit in ``BLOCK_Q`` together. Decode and short chunks then
    stream a KV head's keys once for all its query heads instead of once per head. A program's
    time is its walk over the chunks, the same for one head or four, so fewer programs than SMs
    cost nothing: H200, 2026-12-02, kernels alone, decode at 4096 keys, 8 requests x 32 heads:
    0.080 ms ungrouped, 0.061 ms in 4-head tiles (64 programs); 32 requests x 16 heads: 0.184 and
    0.138 ms. A row's bits do not depend on where in the tile it sits (the tile shape is the
    same), so grouping changes no bit."""
    fits = [g for g in range(2, rep + 1) if rep % g == 0 and g * max(longest_queries, 1) <= BLOCK_Q]
    return max(fits, default=1)


def kv_descriptors_fit(k_SKD: torch.Tensor, v_SKD: torch.Tensor) -> bool:
    """k and v as TMA descriptors of ``[keys, kv_heads * D]``: each (kv head, dim) row contiguous
    and ``descriptor_fits``."""
    return all(t.stride(1) == t.shape[2] and descriptor_fits(t) for t in (k_SKD, v_SKD))


def _kv_descriptor(t: torch.Tensor, chunk: int) -> TensorDescriptor:
    """One KV chunk of one KV head a load: block ``[chunk, D]`` of ``[keys, kv_heads * D]``."""
    S, KVH, D = t.shape
    return TensorDescriptor(t, shape=[S, KVH * D], strides=[t.stride(0), 1],
                            block_shape=[chunk, D])  # fmt: skip


def supports(q_LHD: torch.Tensor, k_SKD: torch.Tensor, kp: KernelPolicy, chunk: int) -> bool:
    """bf16/fp16 q, k, v of one dtype, float32 softmax, power-of-two head dim and chunk >= 16."""
    D = q_LHD.shape[-1]
    return (
        q_LHD.dtype in (torch.bfloat16, torch.float16)
        and k_SKD.dtype == q_LHD.dtype
        and dtype_of(kp.attention_softmax_dtype) == torch.float32
        and D >= 16
        and D & (D - 1) == 0
        and chunk >= 16
        and chunk & (chunk - 1) == 0
    )


def triton_attention_lse(
    q_LHD, k_SKD, v_SKD, q_positions, kp: KernelPolicy, *, cu_seqlens_q=None, cu_seqlens_k=None, scale=None,
    kv_chunk=None, k_starts=None,
):  # fmt: skip
    """The Triton backend of ``chunked_attention_lse``: ``(o_LHD, lse_LH)``, the attention output
    and the float32 log-sum-exp of every row. Inputs the kernel cannot put on tensor cores run the
    reference, as ``triton_attention`` does: a float32 ``tl.dot`` would run as TF32 (Triton's
    default for float32 operands), which is what made the trainer's float32 forward on CUDA
    disagree with transformers by 1.8e-3 while the rollout's agreed to 2.9e-6."""
    kw = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, scale=scale, kv_chunk=kv_chunk)
    kw["k_starts"] = k_starts
    if not supports(q_LHD, k_SKD, kp, kv_chunk or kp.attention_kv_chunk):
        return reference_attention_lse(q_LHD, k_SKD, v_SKD, q_positions, kp, **kw)
    return _attention_lse(q_LHD, k_SKD, v_SKD, q_positions, kp, **kw)


def _attention_lse(
    q_LHD, k_SKD, v_SKD, q_positions, kp: KernelPolicy, *, cu_seqlens_q, cu_seqlens_k, scale, kv_chunk, k_starts
):  # fmt: skip
    """The kernel launch of ``triton_attention_lse``, for inputs ``supports`` accepts."""
    chunk = kv_chunk or kp.attention_kv_chunk
    L, H, D = q_LHD.shape
    S, KVH = k_SKD.shape[0], k_SKD.shape[1]
    scale = D**-0.5 if scale is None else scale
    cu_q = [0, L] if cu_seqlens_q is None else [int(c) for c in cu_seqlens_q.tolist()]
    keys = [(0, S)] if cu_seqlens_q is None else key_rows(cu_seqlens_k, k_starts, len(cu_q) - 1)
    q, k, v = q_LHD.contiguous(), k_SKD.contiguous(), v_SKD.contiguous()
    o_LHD = torch.empty_like(q)
    lse_LH = torch.empty((L, H), dtype=torch.float32, device=q.device)
    for rows in outside_rows(cu_q, L):  # no program writes them: what the reference gives
        o_LHD[rows], lse_LH[rows] = 0, -math.inf
    if H % KVH:
        raise ValueError(
            f"{H} query heads do not share {KVH} KV heads evenly (GQA needs H % KVH == 0)"
        )
    counts = [cu_q[i + 1] - cu_q[i] for i in range(len(cu_q) - 1)]
    group = head_group(H // KVH, max(counts, default=0)) if GROUP_HEADS else 1
    max_k = max((n for _, n in keys), default=0)
    blk = _block_table(tuple(cu_q), tuple(keys), BLOCK_Q // group, q.device)
    if L == 0 or blk.shape[0] == 0:
        return o_LHD, lse_LH
    pos = q_positions.to(device=q.device, dtype=torch.int32).contiguous()
    max_chunks = triton.next_power_of_2(max(1, math.ceil(max_k / chunk)))
    tma = TMA_KV and kv_descriptors_fit(k, v)
    k_desc = _kv_descriptor(k, chunk) if tma else None
    v_desc = _kv_descriptor(v, chunk) if tma else None
    _attn_fwd[(blk.shape[0], H // group)](
        q, k, v, k_desc, v_desc, o_LHD, lse_LH, pos, blk,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        o_LHD.stride(0), o_LHD.stride(1), lse_LH.stride(0), scale * LOG2E,
        H // KVH, group, chunk, D, BLOCK_Q, max_chunks, WHOLE_CHUNKS, tma,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )  # fmt: skip
    return o_LHD, lse_LH


def triton_attention(
    q_LHD, k_SKD, v_SKD, q_positions, kp: KernelPolicy, *, cu_seqlens_q=None, cu_seqlens_k=None, scale=None,
    kv_chunk=None, k_starts=None,
):  # fmt: skip
    """The Triton backend of ``chunked_attention`` (same signature); inputs it cannot put on
    tensor cores (float32/float64 checks) run the reference."""
    kw = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, scale=scale, kv_chunk=kv_chunk)
    kw["k_starts"] = k_starts
    if not supports(q_LHD, k_SKD, kp, kv_chunk or kp.attention_kv_chunk):
        return reference_attention(q_LHD, k_SKD, v_SKD, q_positions, kp, **kw)
    return _attention_lse(q_LHD, k_SKD, v_SKD, q_positions, kp, **kw)[0]


def triton_decode_attention(
    q_BHD, k_SKD, v_SKD, positions_B, k_starts_B, kp: KernelPolicy, *, max_keys, scale=None, kv_chunk=None
):  # fmt: skip
    """The Triton backend of ``decode_attention``: ``_attn_fwd`` with one block per query (what
    ``triton_attention`` launches for a decode step), its block table ``[q, q + 1, k_starts[q],
    positions[q] + 1]`` built on the device, so nothing is read on the host and the launch (grid
    ``(B, H // head_group(rep, 1))``) depends only on the shapes: a CUDA graph can capture it.
    The kernel walks the chunks to each block's position, as for ``triton_attention``: the same
    bits per query (the blocks' order never changed a bit). ``max_keys`` bounds the
    interpreter's compile-time loop only."""
    chunk = kv_chunk or kp.attention_kv_chunk
    if not supports(q_BHD, k_SKD, kp, chunk):
        return reference_decode_attention(
            q_BHD, k_SKD, v_SKD, positions_B, k_starts_B, kp, max_keys=max_keys, scale=scale,
            kv_chunk=kv_chunk,
        )  # fmt: skip
    B, H, D = q_BHD.shape
    KVH = k_SKD.shape[1]
    if H % KVH:
        raise ValueError(
            f"{H} query heads do not share {KVH} KV heads evenly (GQA needs H % KVH == 0)"
        )
    scale = D**-0.5 if scale is None else scale
    q, k, v = q_BHD.contiguous(), k_SKD.contiguous(), v_SKD.contiguous()
    o_BHD = torch.empty_like(q)
    lse_BH = torch.empty((B, H), dtype=torch.float32, device=q.device)
    if B == 0:
        return o_BHD
    group = head_group(H // KVH, 1) if GROUP_HEADS else 1
    pos = positions_B.to(device=q.device, dtype=torch.int32).contiguous()
    rows = torch.arange(B, dtype=torch.int32, device=q.device)
    k0 = k_starts_B.to(device=q.device, dtype=torch.int32)
    blk = torch.stack([rows, rows + 1, k0, pos + 1], dim=1).contiguous()
    max_chunks = triton.next_power_of_2(max(1, math.ceil(max_keys / chunk)))
    tma = TMA_KV and kv_descriptors_fit(k, v)
    k_desc = _kv_descriptor(k, chunk) if tma else None
    v_desc = _kv_descriptor(v, chunk) if tma else None
    _attn_fwd[(B, H // group)](
        q, k, v, k_desc, v_desc, o_BHD, lse_BH, pos, blk,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        o_BHD.stride(0), o_BHD.stride(1), lse_BH.stride(0), scale * LOG2E,
        H // KVH, group, chunk, D, BLOCK_Q, max_chunks, WHOLE_CHUNKS, tma,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )  # fmt: skip
    return o_BHD
