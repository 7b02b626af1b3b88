"""Triton backward of the causal GQA attention, from the saved output and log-sum-exp.

FlashAttention-2's backward in two deterministic kernels (no atomics, so a gradient's bits do not
depend on scheduling):

- ``_attn_bwd_dkdv``: one program per (block of ``BLOCK_K`` key rows of one sequence, KV head). It
  walks the ``REP`` query heads that share the KV head and, for each, the query blocks that can
  see the key block (queries at positions >= the block's first key; earlier blocks are causally
  empty and skipped), accumulating ``dV += Pᵀ dO`` and ``dK += dSᵀ Q`` in float32.
- ``_attn_bwd_dq``: one program per (block of ``BLOCK_Q`` query rows, query head), walking the key
  blocks up to the block's last position: ``dQ += dS K``.

Per tile: ``P = exp(S - lse)`` on visible keys (0 elsewhere), computed as ``exp2`` of one fused
multiply-add with the scale and the log-sum-exp in log2 units; ``dP = dO Vᵀ``,
``dS = P ∘ (dP - delta)`` with ``delta = rowsum(dO ∘ O)`` (``_attn_bwd_delta``, once per row); ``P``
and ``dS`` are rounded to the operands' dtype for their tensor-core dots (as FA2/FA3 do), float32
accumulate. In ``_attn_bwd_dq`` only the key blocks that straddle the causal diagonal (or the end
of the keys) are masked; a block every query sees whole runs without the masks, which would keep
every value.
The gradient is not part of the logprob contract (only the forward's bits are); it is checked
against float64 autograd with a tolerance.

Needs what the forward's Triton path needs (``forward.supports``) and, per sequence, query
positions ``p0, p0 + 1, ...`` (what a packed training batch holds); other inputs run the PyTorch
reference backward.
"""

from __future__ import annotations

import functools
import itertools

import torch
import triton
import triton.language as tl

from ..attention import reference_attention_backward
from ..policy import KernelPolicy
from . import attention as forward
from .arith import INTERPRET, _round
from .attention import _dot, _kv_rows

LOG2E = tl.constexpr(forward.LOG2E)  # read inside the kernels: a compile-time constant

# Launch shapes of the two kernels: query rows, key rows, warps, pipeline stages. They change no
# forward bit (and gave the same gradient bits as every other shape swept); the fastest of
# benchmarks/tune_attention.py's sweep on an H200, kernels alone (``--kernel-time``), Qwen3-4B
# heads, 32 x 512 packed tokens, 2026-12-02 (BENCHMARKS.md).
DKDV = {"BLOCK_Q": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}
DQ = {"BLOCK_Q": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}
DELTA_ROWS = 64  # (query, head) rows per program of ``_attn_bwd_delta``


@triton.jit
def _attn_bwd_delta(o_ptr, do_ptr, delta_ptr, rows, so, sdo, H: tl.constexpr, D: tl.constexpr,
                    BLOCK: tl.constexpr):  # fmt: skip
    """``delta = rowsum(dO ∘ O)`` in float32 for ``BLOCK`` (query, head) rows of ``[L, H, D]``
    tensors whose heads are contiguous (``[L, H]`` out)."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D)
    mask = (r < rows)[:, None]
    o = tl.load(o_ptr + (r // H * so + r % H * D)[:, None] + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(
        do_ptr + (r // H * sdo + r % H * D)[:, None] + offs_d[None, :], mask=mask, other=0.0
    )
    tl.store(delta_ptr + r, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=r < rows)


@triton.jit
def _dkdv_tile(
    dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, pos_ptr, qb, q0, q1, h, kpos,
    sq, sqh, sdo, sdoh, slse, scale2, D: tl.constexpr, BLOCK_Q: tl.constexpr,
):  # fmt: skip
    offs_q = q0 + qb * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, D)
    qmask = offs_q < q1
    q = tl.load(
        q_ptr + offs_q[:, None] * sq + h * sqh + offs_d[None, :], mask=qmask[:, None], other=0.0
    )
    do = tl.load(
        do_ptr + offs_q[:, None] * sdo + h * sdoh + offs_d[None, :], mask=qmask[:, None], other=0.0
    )
    lse2 = tl.load(lse_ptr + offs_q * slse + h, mask=qmask, other=0.0) * LOG2E
    delta = tl.load(delta_ptr + offs_q * slse + h, mask=qmask, other=0.0)
    s_T = _dot(k, tl.trans(q))  # [BLOCK_K, BLOCK_Q], unscaled
    pos = tl.load(pos_ptr + offs_q, mask=qmask, other=-1)
    visible = (kpos[:, None] <= pos[None, :]) & qmask[None, :]
    p_T = tl.where(visible, tl.exp2(tl.fma(s_T, scale2, -lse2[None, :])), 0.0)
    dv += _dot(_round(p_T, q.dtype), do)
    dp_T = _dot(v, tl.trans(do))
    ds_T = p_T * (dp_T - delta[None, :])
    dk += _dot(_round(ds_T, q.dtype), q)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, pos_ptr, dk_ptr, dv_ptr, blk_ptr,
    sq, sqh, sk, skh, sv, svh, sdo, sdoh, slse, sdk, sdkh, sdv, sdvh, scale, scale2,
    REP: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
    MAX_QBLOCKS: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    k0 = tl.load(blk_ptr + 5 * b)  # first key row of the sequence
    kb = tl.load(blk_ptr + 5 * b + 1)  # this block's first key position
    klen = tl.load(blk_ptr + 5 * b + 2)
    q0 = tl.load(blk_ptr + 5 * b + 3)  # the sequence's query rows [q0, q1)
    q1 = tl.load(blk_ptr + 5 * b + 4)
    # the first query block that sees key ``kb``: query row q0 + j sits at position p0 + j
    qb_first = tl.maximum(kb - tl.load(pos_ptr + q0), 0) // BLOCK_Q
    qb_end = (q1 - q0 + BLOCK_Q - 1) // BLOCK_Q
    kpos = kb + tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, D)
    kmask = kpos < klen
    k = tl.load(
        k_ptr + (k0 + kpos)[:, None] * sk + kvh * skh + offs_d[None, :],
        mask=kmask[:, None],
        other=0.0,
    )
    v = tl.load(
        v_ptr + (k0 + kpos)[:, None] * sv + kvh * svh + offs_d[None, :],
        mask=kmask[:, None],
        other=0.0,
    )
    dk = tl.zeros((BLOCK_K, D), tl.float32)
    dv = tl.zeros((BLOCK_K, D), tl.float32)
    for r in range(REP):
        h = kvh * REP + r
        if INTERPRET:  # the interpreter loops only to compile-time bounds
            for qb in range(MAX_QBLOCKS):
                if qb >= qb_first and qb < qb_end:
                    dk, dv = _dkdv_tile(
                        dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, pos_ptr, qb, q0, q1, h,
                        kpos, sq, sqh, sdo, sdoh, slse, scale2, D, BLOCK_Q,
                    )  # fmt: skip
        else:  # one masked loop: split in two (as dQ's), it spilled three times as much
            for qb in range(qb_first, qb_end):
                dk, dv = _dkdv_tile(
                    dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, pos_ptr, qb, q0, q1, h,
                    kpos, sq, sqh, sdo, sdoh, slse, scale2, D, BLOCK_Q,
                )  # fmt: skip
    tl.store(
        dk_ptr + (k0 + kpos)[:, None] * sdk + kvh * sdkh + offs_d[None, :],
        _round(dk * scale, dk_ptr.dtype.element_ty),
        mask=kmask[:, None],
    )
    tl.store(
        dv_ptr + (k0 + kpos)[:, None] * sdv + kvh * sdvh + offs_d[None, :],
        _round(dv, dv_ptr.dtype.element_ty),
        mask=kmask[:, None],
    )


@triton.jit
def _dq_tile(
    dq, q, do, lse2, delta, pos, k_ptr, v_ptr, c, k0, klen, kvh, sk, skh, sv, svh, scale2,
    D: tl.constexpr, BLOCK_K: tl.constexpr, MASK: tl.constexpr,
):  # fmt: skip
    """One key block into a query block's ``dQ``. ``MASK=False`` for a key block inside the
    keys and at or before every row's position."""
    kpos = c * BLOCK_K + tl.arange(0, BLOCK_K)
    k, v = _kv_rows(k_ptr, v_ptr, k0, kpos, klen, kvh, sk, skh, sv, svh, D, MASK)
    s = _dot(q, tl.trans(k))  # [BLOCK_Q, BLOCK_K], unscaled
    p = tl.exp2(tl.fma(s, scale2, -lse2[:, None]))
    if MASK:
        p = tl.where((kpos[None, :] <= pos[:, None]) & (kpos < klen)[None, :], p, 0.0)
    dp = _dot(do, tl.trans(v))
    ds = p * (dp - delta[:, None])
    return dq + _dot(_round(ds, k.dtype), k)


@triton.jit
def _attn_bwd_dq(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, pos_ptr, dq_ptr, blk_ptr,
    sq, sqh, sk, skh, sv, svh, sdo, sdoh, slse, sdq, sdqh, scale, scale2,
    REP: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
    MAX_KBLOCKS: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // REP
    q0 = tl.load(blk_ptr + 4 * b)
    q1 = tl.load(blk_ptr + 4 * b + 1)
    k0 = tl.load(blk_ptr + 4 * b + 2)
    klen = tl.load(blk_ptr + 4 * b + 3)
    offs_q = q0 + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, D)
    qmask = offs_q < q1
    q = tl.load(
        q_ptr + offs_q[:, None] * sq + h * sqh + offs_d[None, :], mask=qmask[:, None], other=0.0
    )
    do = tl.load(
        do_ptr + offs_q[:, None] * sdo + h * sdoh + offs_d[None, :], mask=qmask[:, None], other=0.0
    )
    lse2 = tl.load(lse_ptr + offs_q * slse + h, mask=qmask, other=0.0) * LOG2E
    delta = tl.load(delta_ptr + offs_q * slse + h, mask=qmask, other=0.0)
    pos = tl.load(pos_ptr + offs_q, mask=qmask, other=-1)
    dq = tl.zeros((BLOCK_Q, D), tl.float32)
    last = tl.max(pos, 0) // BLOCK_K
    # key blocks [0, whole) are seen whole by every row: before the lowest position, in the keys
    lowest = tl.min(tl.where(qmask, pos, 2147483647), 0)
    whole = tl.minimum((lowest + 1) // BLOCK_K, klen // BLOCK_K)
    if INTERPRET:
        for c in range(MAX_KBLOCKS):
            if c < whole:
                dq = _dq_tile(
                    dq, q, do, lse2, delta, pos, k_ptr, v_ptr, c, k0, klen, kvh, sk, skh, sv, svh,
                    scale2, D, BLOCK_K, False,
                )  # fmt: skip
            elif c <= last:
                dq = _dq_tile(
                    dq, q, do, lse2, delta, pos, k_ptr, v_ptr, c, k0, klen, kvh, sk, skh, sv, svh,
                    scale2, D, BLOCK_K, True,
                )  # fmt: skip
    else:
        for c in range(0, whole):
            dq = _dq_tile(
                dq, q, do, lse2, delta, pos, k_ptr, v_ptr, c, k0, klen, kvh, sk, skh, sv, svh,
                scale2, D, BLOCK_K, False,
            )  # fmt: skip
        for c in range(whole, last + 1):
            dq = _dq_tile(
                dq, q, do, lse2, delta, pos, k_ptr, v_ptr, c, k0, klen, kvh, sk, skh, sv, svh,
                scale2, D, BLOCK_K, True,
            )  # fmt: skip
    tl.store(
        dq_ptr + offs_q[:, None] * sdq + h * sdqh + offs_d[None, :],
        _round(dq * scale, dq_ptr.dtype.element_ty),
        mask=qmask[:, None],
    )


@functools.lru_cache(maxsize=64)
def _sequence_starts(cu_q: tuple, device) -> torch.Tensor:
    """``[rows]`` bool, True on each sequence's first query row; kept per pack (one copy)."""
    first = torch.zeros(cu_q[-1], dtype=torch.bool)
    first[[c for c in cu_q[:-1] if c < cu_q[-1]]] = True
    return first.to(device)


def _positions_contiguous(pos: torch.Tensor, cu_q: list[int]) -> bool:
    """Whether each sequence's query positions run ``p0, p0 + 1, ...``: every row one past the
    row before it, except where a sequence starts (one device sync, for the verdict)."""
    rows = cu_q[-1]
    if rows < 2:
        return True
    step = pos[1:rows] - pos[: rows - 1] == 1
    return bool((step | _sequence_starts(tuple(cu_q), pos.device)[1:]).all())


@functools.lru_cache(maxsize=64)
def _block_tables(cu_q: tuple, cu_k: tuple, dkdv: tuple, dq: tuple, device):
    """Both kernels' block tables of one pack, kept (as the forward's ``_block_table``): the
    layers of a step share them. ``dkdv`` and ``dq`` are the launch shapes they were cut for."""
    return _dkdv_blocks(cu_q, cu_k, device), _dq_blocks(cu_q, cu_k, device)


def _dkdv_blocks(cu_q, cu_k, device) -> torch.Tensor:
    """Per program: ``(first key row, block's first key position, keys, q0, q1)``,
    ``[num_blocks, 5]`` int32; a sequence without queries has none."""
    rows = [
        (cu_k[i], kb, cu_k[i + 1] - cu_k[i], cu_q[i], cu_q[i + 1])
        for i in range(len(cu_q) - 1)
        if cu_q[i + 1] > cu_q[i]
        for kb in range(0, cu_k[i + 1] - cu_k[i], DKDV["BLOCK_K"])
    ]
    return torch.tensor(rows, dtype=torch.int32, device=device).reshape(-1, 5)


def _dq_blocks(cu_q, cu_k, device) -> torch.Tensor:
    """Per program: ``(q0, q1, first key row, keys)``, ``[num_blocks, 4]`` int32."""
    bq = DQ["BLOCK_Q"]
    rows = [
        (q, min(q + bq, cu_q[i + 1]), cu_k[i], cu_k[i + 1] - cu_k[i])
        for i in range(len(cu_q) - 1)
        for q in range(cu_q[i], cu_q[i + 1], bq)
    ]
    return torch.tensor(rows, dtype=torch.int32, device=device).reshape(-1, 4)


def triton_attention_backward(
    q_LHD, k_SKD, v_SKD, o_LHD, lse_LH, do_LHD, q_positions, kp: KernelPolicy, *, cu_seqlens_q=None,
    cu_seqlens_k=None, scale=None, kv_chunk=None, positions_contiguous: bool | None = None,
):  # fmt: skip
    """The Triton backend of ``attention_backward`` (same signature and results as
    ``reference_attention_backward``, tensor-core tile dots); other inputs run the reference.

    ``positions_contiguous``: the caller's word that every sequence's query positions run
    ``p0, p0 + 1, ...`` (True) or not (False); ``None`` checks on the device, which reads the
    verdict back on the host (``_positions_contiguous``: a sync per call)."""
    kw = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, scale=scale, kv_chunk=kv_chunk)
    args = (q_LHD, k_SKD, v_SKD, o_LHD, lse_LH, do_LHD, q_positions, kp)
    L, H, D = q_LHD.shape
    S, KVH = k_SKD.shape[:2]
    cu_q = [0, L] if cu_seqlens_q is None else [int(c) for c in cu_seqlens_q.tolist()]
    cu_k = [0, S] if cu_seqlens_k is None else [int(c) for c in cu_seqlens_k.tolist()]
    if len(cu_q) != len(cu_k):
        raise ValueError(f"cu_seqlens_q has {len(cu_q)} entries, cu_seqlens_k {len(cu_k)}")
    usable = (
        forward.supports(q_LHD, k_SKD, kp, kv_chunk or kp.attention_kv_chunk)
        and v_SKD.dtype == q_LHD.dtype
        and L > 0
    )
    pos = q_positions.to(device=q_LHD.device, dtype=torch.int32).contiguous()
    if positions_contiguous is None and usable:
        positions_contiguous = _positions_contiguous(pos, cu_q)
    if not (usable and positions_contiguous):
        return reference_attention_backward(*args, **kw)
    scale = D**-0.5 if scale is None else scale
    q, k, v = q_LHD.contiguous(), k_SKD.contiguous(), v_SKD.contiguous()
    do = do_LHD.to(q.dtype).contiguous()
    lse = lse_LH.to(torch.float32).contiguous()
    o = o_LHD.contiguous()
    delta = torch.empty((L, H), dtype=torch.float32, device=q.device)
    _attn_bwd_delta[(triton.cdiv(L * H, DELTA_ROWS),)](
        o, do, delta, L * H, o.stride(0), do.stride(0), H, D, DELTA_ROWS
    )
    # a sequence without queries has no dK/dV program; every query row of a sequence is some
    # dQ program's, and the rows outside them get 0, as from the reference
    dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for rows in forward.outside_rows(cu_q, L):
        dq[rows] = 0
    scale2 = scale * forward.LOG2E
    max_q = max(b - a for a, b in itertools.pairwise(cu_q))
    max_k = max(b - a for a, b in itertools.pairwise(cu_k))
    kblk, qblk = _block_tables(
        tuple(cu_q), tuple(cu_k), tuple(DKDV.items()), tuple(DQ.items()), q.device
    )
    if kblk.shape[0]:
        _attn_bwd_dkdv[(kblk.shape[0], KVH)](
            q, k, v, do, lse, delta, pos, dk, dv, kblk,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            do.stride(0), do.stride(1), lse.stride(0), dk.stride(0), dk.stride(1),
            dv.stride(0), dv.stride(1), scale, scale2,
            H // KVH, D, DKDV["BLOCK_Q"], DKDV["BLOCK_K"],
            triton.next_power_of_2(triton.cdiv(max_q, DKDV["BLOCK_Q"])),
            num_warps=DKDV["num_warps"], num_stages=DKDV["num_stages"],
        )  # fmt: skip
    if qblk.shape[0]:
        _attn_bwd_dq[(qblk.shape[0], H)](
            q, k, v, do, lse, delta, pos, dq, qblk,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            do.stride(0), do.stride(1), lse.stride(0), dq.stride(0), dq.stride(1), scale, scale2,
            H // KVH, D, DQ["BLOCK_Q"], DQ["BLOCK_K"],
            triton.next_power_of_2(triton.cdiv(max(max_k, 1), DQ["BLOCK_K"])),
            num_warps=DQ["num_warps"], num_stages=DQ["num_stages"],
        )  # fmt: skip
    return dq, dk, dv
