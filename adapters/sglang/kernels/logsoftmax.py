"""Per-token log-probabilities with a fixed-order reduction over the vocabulary.

``token_logprobs``: padded vocab columns are trimmed, logits are cast to ``kp.logsoftmax_dtype``
(that cast is the contract's rounding: bf16 in the public v1), then computed in float32 (as torch's
``log_softmax`` does for bf16 inputs): ``m = max`` (exact, order free), ``exp(x - m)`` summed per
``kp.logsoftmax_vocab_block`` chunk (fixed length, the last chunk padded with -inf), chunk sums
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


def _compute_dtype(ld: torch.dtype) -> torch.dtype:
    return torch.promote_types(ld, torch.float32)


def _chunk_sums(x_TV: torch.Tensor, m_T: torch.Tensor, block: int) -> torch.Tensor:
    """``sum(exp(x - m))`` per vocab chunk: ``[T, C]``."""
    T, V = x_TV.shape
    C = math.ceil(V / block)
    x_p = F.pad(x_TV, (0, C * block - V), value=-math.inf)
    e = torch.exp(x_p - m_T[:, None])
    return e.view(T, C, block).sum(-1)


def _pairwise_over_chunks(s_TC: torch.Tensor) -> torch.Tensor:
    while s_TC.shape[1] > 1:
        n = s_TC.shape[1]
        even = n - n % 2
        summed = s_TC[:, 0:even:2] + s_TC[:, 1:even:2]
        s_TC = torch.cat([summed, s_TC[:, even:]], dim=1) if n % 2 else summed
    return s_TC[:, 0]


def full_logprobs(logits_TV: torch.Tensor, kp, vocab_size: int) -> torch.Tensor:
    """The whole log-softmax ``[T, vocab_size]`` (same per-element formula as ``token_logprobs``)."""
    ld = dtype_of(kp.logsoftmax_dtype)
    x = logits_TV[..., :vocab_size].to(ld).to(_compute_dtype(ld))
    m = x.amax(-1)
    s = _pairwise_over_chunks(_chunk_sums(x, m, kp.logsoftmax_vocab_block))
    return ((x - m[:, None]) - torch.log(s)[:, None]).to(ld)


def token_logprobs(
    logits_TV: torch.Tensor, token_ids_T: torch.Tensor, kp, vocab_size: int
) -> torch.Tensor:
    """``log p(token_ids[t] | logits[t])`` in ``kp.logsoftmax_dtype``."""
    ld = dtype_of(kp.logsoftmax_dtype)
    x = logits_TV[..., :vocab_size].to(ld).to(_compute_dtype(ld))
    m = x.amax(-1)
    s = _pairwise_over_chunks(_chunk_sums(x, m, kp.logsoftmax_vocab_block))
    tok = x.gather(-1, token_ids_T.long()[:, None])[:, 0]
    return ((tok - m) - torch.log(s)).to(ld)


def vocab_parallel_token_logprobs(
    local_logits_TVl: torch.Tensor,
    token_ids_T: torch.Tensor,
    vocab_start: int,
    vocab_size: int,
    kp,
    group=None,
) -> torch.Tensor:
    """``token_logprobs`` over a vocab shard per rank (columns ``vocab_start ..``), same bits.

    Shards must start on multiples of ``kp.logsoftmax_vocab_block`` and have equal width (Megatron
    pads the vocab so). Columns at or past ``vocab_size`` are padding and are dropped. Forward only.
    """
    block = kp.logsoftmax_vocab_block
    if vocab_start % block:
        raise ValueError(f"vocab shard start {vocab_start} is not a multiple of the block {block}")
    ld = dtype_of(kp.logsoftmax_dtype)
    cd = _compute_dtype(ld)
    T, Vl = local_logits_TVl.shape
    if world_size(group) > 1 and Vl % block:
        raise ValueError(f"vocab shard width {Vl} is not a multiple of the block {block}")
    real = max(0, min(Vl, vocab_size - vocab_start))
    x = local_logits_TVl[:, :real].to(ld).to(cd)
    m_local = x.amax(-1) if real else torch.full((T,), -math.inf, dtype=cd)
    maxes = all_gather_exact(m_local, group) if world_size(group) > 1 else [m_local]
    m = torch.stack(maxes).amax(0)
    c_local = math.ceil(Vl / block)
    sums = torch.zeros(T, c_local, dtype=cd)
    if real:
        cs = _chunk_sums(x, m, block)
        sums[:, : cs.shape[1]] = cs
    parts = all_gather_exact(sums, group) if world_size(group) > 1 else [sums]
    s_TC = torch.cat(parts, dim=1)[:, : math.ceil(vocab_size / block)]
    s = _pairwise_over_chunks(s_TC)
    ids = token_ids_T.long()
    local_idx = (ids - vocab_start).clamp(0, max(real - 1, 0))
    owned = (ids >= vocab_start) & (ids < vocab_start + real)
    tok_local = x.gather(-1, local_idx[:, None])[:, 0] if real else torch.zeros(T, dtype=cd)
    tok_local = torch.where(owned, tok_local, torch.zeros_like(tok_local))
    toks = all_gather_exact(tok_local, group) if world_size(group) > 1 else [tok_local]
    owners = all_gather_exact(owned.to(torch.int32), group) if world_size(group) > 1 else [owned]
    tok = sum_select(toks, owners)
    return ((tok - m) - torch.log(s)).to(ld)


def sum_select(values: list[torch.Tensor], owners: list[torch.Tensor]) -> torch.Tensor:
    """Per element, the value from the rank that owns it (exact: no arithmetic)."""
    out = values[0]
    for val, own in zip(values[1:], owners[1:], strict=True):
        out = torch.where(own.bool(), val, out)
    return out
