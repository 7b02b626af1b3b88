"""Per-token log-probabilities with a fixed-order reduction over the vocabulary.

``token_logprobs``: padded vocab columns are trimmed, logits are cast to ``kp.logsoftmax_dtype``
(that cast is the contract's rounding: bf16 in the public v1), then computed in float32 (as torch's
``log_softmax`` does for bf16 inputs): ``m = max`` (exact, order free), ``exp(x - m)`` summed per
``kp.logsoftmax_vocab_block`` chunk (``fixed_sum``) (fixed length, the last chunk padded with -inf), chunk sums
combined by adjacent pairwise sums over chunks in vocab order; ``lp = (x_tok - m) - log(s)``,
returned in ``kp.logsoftmax_dtype``.

The vocab-parallel form gathers the per-chunk sums from all ranks and runs the same tree, so it is
bit-identical to the full form whenever every shard starts on a chunk boundary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._dtypes import dtype_of
from .all_reduce import all_gather_exact, world_size
from .audit import contract_op
from .matmul import invariant_matmul
from .policy import KernelPolicy
from .reduce import fixed_sum
from .registry import kernel


def _compute_dtype(ld: torch.dtype) -> torch.dtype:
    return torch.promote_types(ld, torch.float32)


def _chunk_sums(x_TV: torch.Tensor, m_T: torch.Tensor, block: int) -> torch.Tensor:
    """``sum(exp(x - m))`` per vocab chunk: ``[T, C]``, by the backend the registry names for
    ``x``'s device (``reference_chunk_sums`` is the contract)."""
    if torch.is_grad_enabled() and x_TV.requires_grad:
        return reference_chunk_sums(x_TV, m_T, block)
    return kernel("logsoftmax_chunk_sums", x_TV.device)(x_TV, m_T, block)


def reference_chunk_sums(x_TV: torch.Tensor, m_T: torch.Tensor, block: int) -> torch.Tensor:
    """The PyTorch backend of ``_chunk_sums``: the row padded with ``-inf`` to whole chunks,
    ``exp(x - m)``, each chunk summed by ``fixed_sum``."""
    T, V = x_TV.shape
    C = math.ceil(V / block)
    x_p = F.pad(x_TV, (0, C * block - V), value=-math.inf)
    e = torch.exp(x_p - m_T[:, None])
    return fixed_sum(e.view(T, C, block))


def _pairwise_over_chunks(s_TC: torch.Tensor) -> torch.Tensor:
    while s_TC.shape[1] > 1:
        n = s_TC.shape[1]
        even = n - n % 2
        summed = s_TC[:, 0:even:2] + s_TC[:, 1:even:2]
        s_TC = torch.cat([summed, s_TC[:, even:]], dim=1) if n % 2 else summed
    return s_TC[:, 0]


@contract_op("full_logprobs")
def full_logprobs(logits_TV: torch.Tensor, kp: KernelPolicy, vocab_size: int) -> torch.Tensor:
    """The whole log-softmax ``[T, vocab_size]`` (same per-element formula as ``token_logprobs``)."""
    ld = dtype_of(kp.logsoftmax_dtype)
    x = logits_TV[..., :vocab_size].to(ld).to(_compute_dtype(ld))
    m = x.amax(-1)
    s = _pairwise_over_chunks(_chunk_sums(x, m, kp.logsoftmax_vocab_block))
    return ((x - m[:, None]) - torch.log(s)[:, None]).to(ld)


# Logits rows per step of ``token_logprobs``: its float32 working copy is bounded by this many
# elements whatever the number of tokens (each row's bits depend only on that row).
_BLOCK_ELEMENTS = 1 << 24


def _token_logprobs_rows(
    x_TV: torch.Tensor, ids_T: torch.Tensor, kp: KernelPolicy, vocab_size: int
):
    ld = dtype_of(kp.logsoftmax_dtype)
    x = x_TV[..., :vocab_size].to(ld).to(_compute_dtype(ld))
    m = x.amax(-1)
    s = _pairwise_over_chunks(_chunk_sums(x, m, kp.logsoftmax_vocab_block))
    tok = x.gather(-1, ids_T.long()[:, None])[:, 0]
    return ((tok - m) - torch.log(s)).to(ld)


@contract_op("token_logprobs")
def token_logprobs(
    logits_TV: torch.Tensor, token_ids_T: torch.Tensor, kp: KernelPolicy, vocab_size: int
) -> torch.Tensor:
    """``log p(token_ids[t] | logits[t])`` in ``kp.logsoftmax_dtype``, in blocks of rows."""
    rows = max(1, _BLOCK_ELEMENTS // max(1, vocab_size))
    T = logits_TV.shape[0]
    if T <= rows:
        return _token_logprobs_rows(logits_TV, token_ids_T, kp, vocab_size)
    parts = [
        _token_logprobs_rows(logits_TV[i : i + rows], token_ids_T[i : i + rows], kp, vocab_size)
        for i in range(0, T, rows)
    ]
    return torch.cat(parts)


def lm_head_token_logprobs(
    h_TH: torch.Tensor,
    w_VH: torch.Tensor,
    token_ids_T: torch.Tensor,
    kp: KernelPolicy,
    vocab_size: int,
) -> torch.Tensor:
    """LM head and scored-token logprob together, in blocks of tokens: the ``[tokens, vocab]``
    logits exist one block at a time (the invariant matmul and the log-softmax are both per row,
    so the bits equal ``token_logprobs(invariant_matmul(h, w), ids)``)."""
    rows = max(1, _BLOCK_ELEMENTS // max(1, w_VH.shape[0]))
    lm = dtype_of(kp.lm_head_input_dtype)
    parts = [
        token_logprobs(
            invariant_matmul(h_TH[i : i + rows].to(lm), w_VH.to(lm), kp),
            token_ids_T[i : i + rows],
            kp,
            vocab_size,
        )
        for i in range(0, h_TH.shape[0], rows)
    ]
    return torch.cat(parts) if parts else h_TH.new_zeros(0, dtype=dtype_of(kp.logsoftmax_dtype))


class _VocabParallelLogprob(torch.autograd.Function):
    """Forward: fixed-order global max / sum-exp over vocab shards. Backward: the local part of
    ``onehot - softmax`` (no communication), as Megatron's vocab-parallel cross entropy."""

    @staticmethod
    def forward(ctx, x_TVr, ids_T, vocab_start, vocab_size, block, width, group):
        T, real = x_TVr.shape
        cd, dev = x_TVr.dtype, x_TVr.device
        gathered = world_size(group) > 1
        m_local = x_TVr.amax(-1) if real else torch.full((T,), -math.inf, dtype=cd, device=dev)
        m = torch.stack(all_gather_exact(m_local, group) if gathered else [m_local]).amax(0)
        sums = torch.zeros(T, math.ceil(width / block), dtype=cd, device=dev)
        if real:
            cs = _chunk_sums(x_TVr, m, block)
            sums[:, : cs.shape[1]] = cs
        parts = all_gather_exact(sums, group) if gathered else [sums]
        s = _pairwise_over_chunks(torch.cat(parts, dim=1)[:, : math.ceil(vocab_size / block)])
        local_idx = (ids_T - vocab_start).clamp(0, max(real - 1, 0))
        owned = (ids_T >= vocab_start) & (ids_T < vocab_start + real)
        tok_local = x_TVr.gather(-1, local_idx[:, None])[:, 0] if real else torch.zeros_like(m)
        tok_local = torch.where(owned, tok_local, torch.zeros_like(tok_local))
        toks = all_gather_exact(tok_local, group) if gathered else [tok_local]
        owners = all_gather_exact(owned.to(torch.uint8), group) if gathered else [owned]
        tok = sum_select(toks, owners)
        ctx.save_for_backward(x_TVr, m, s, local_idx, owned)
        return (tok - m) - torch.log(s)

    @staticmethod
    def backward(ctx, g_T):
        x, m, s, local_idx, owned = ctx.saved_tensors
        grad = kernel("logprob_backward", x.device)(x, m, s, local_idx, owned, g_T)
        return grad, None, None, None, None, None, None


def reference_logprob_backward(x_TV, m_T, s_T, local_idx_T, owned_T, g_T) -> torch.Tensor:
    """The gradient of ``(x[tok] - m) - log(s)`` (tok owned by this shard) with respect to the
    shard's logits ``x``: ``g * (onehot - exp(x - m) / s)``. Not part of the contract's bits (only
    the forward is); checked against float64 autograd."""
    grad = -g_T[:, None] * (torch.exp(x_TV - m_T[:, None]) / s_T[:, None])
    if x_TV.shape[1]:
        onehot = torch.zeros_like(grad).scatter_(1, local_idx_T[:, None], 1.0)
        grad = grad + g_T[:, None] * onehot * owned_T[:, None].to(grad.dtype)
    return grad


@contract_op("vocab_parallel_token_logprobs")
def vocab_parallel_token_logprobs(
    local_logits_TVl: torch.Tensor,
    token_ids_T: torch.Tensor,
    vocab_start: int,
    vocab_size: int,
    kp: KernelPolicy,
    group=None,
) -> torch.Tensor:
    """``token_logprobs`` over a vocab shard per rank (columns ``vocab_start ..``), same bits.

    Shards must start on multiples of ``kp.logsoftmax_vocab_block`` and have equal width (Megatron
    pads the vocab so). Columns at or past ``vocab_size`` are padding and are dropped.
    Differentiable with respect to ``local_logits`` (local backward, no communication).

    Rows (tokens) go in blocks of ``_BLOCK_ELEMENTS // width`` (each row's bits depend only on
    that row; every rank has the same rows and width, so the ranks' collectives pair up), so the
    float32 working copies are one block's, not ``[tokens, vocab]``.
    """
    T, Vl = local_logits_TVl.shape
    rows = max(1, _BLOCK_ELEMENTS // max(1, Vl))
    if T <= rows:
        return _vocab_parallel_token_logprobs(
            local_logits_TVl, token_ids_T, vocab_start, vocab_size, kp, group
        )
    parts = [
        _vocab_parallel_token_logprobs(
            local_logits_TVl[i : i + rows],
            token_ids_T[i : i + rows],
            vocab_start,
            vocab_size,
            kp,
            group,
        )
        for i in range(0, T, rows)
    ]
    return torch.cat(parts)


def _vocab_parallel_token_logprobs(
    local_logits_TVl: torch.Tensor,
    token_ids_T: torch.Tensor,
    vocab_start: int,
    vocab_size: int,
    kp: KernelPolicy,
    group,
) -> torch.Tensor:
    """``vocab_parallel_token_logprobs`` of one block of rows."""
    block = kp.logsoftmax_vocab_block
    if vocab_start % block:
        raise ValueError(f"vocab shard start {vocab_start} is not a multiple of the block {block}")
    ld = dtype_of(kp.logsoftmax_dtype)
    Vl = local_logits_TVl.shape[1]
    if world_size(group) > 1 and Vl % block:
        raise ValueError(f"vocab shard width {Vl} is not a multiple of the block {block}")
    real = max(0, min(Vl, vocab_size - vocab_start))
    x = local_logits_TVl[:, :real].to(ld).to(_compute_dtype(ld))
    ids = token_ids_T.long().to(x.device)
    lp = _VocabParallelLogprob.apply(x, ids, vocab_start, vocab_size, block, Vl, group)
    return lp.to(ld)


def sum_select(values: list[torch.Tensor], owners: list[torch.Tensor]) -> torch.Tensor:
    """Per element, the value from the rank that owns it (exact: no arithmetic)."""
    out = values[0]
    for val, own in zip(values[1:], owners[1:], strict=True):
        out = torch.where(own.bool(), val, out)
    return out
