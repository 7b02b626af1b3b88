"""The processed distribution every side scores: one definition for the rollout and the trainers.

The processed distribution of a request (``SamplingParams``) is what its tokens are drawn from and
what every side scores: logits cast to the contract's ``logsoftmax_dtype``, divided by the
temperature in float32 and rounded back to that dtype (what SGLang's sampler does in RL on-policy
mode: ``logits.bfloat16().div(temperatures).bfloat16()``), then, where top-k / top-p truncate,
every token outside the kept set set to ``-inf``; the contract's log-softmax kernel of that is the
logprob. Greedy requests (temperature <= 0) are scored at temperature 1 on the whole vocab, as
SGLang returns them. Temperature 1 with no truncation leaves the logits' bits unchanged.

The kept set (``keep_mask``) is computed from the whole row of temperature-scaled logits on the
CPU in float64 (sorted by probability, ties by lower token id; top-k first, then the smallest
prefix of the top-k renormalised distribution whose mass reaches top-p), so the rollout (whole
rows) and the trainer (vocab shards, gathered for truncated rows: ``process_shard``,
``process_rows``) build the same set bit for bit. The draw itself is the rollout's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..kernels._dtypes import dtype_of
from ..kernels.all_reduce import all_gather_exact, world_size
from ..kernels.policy import KernelPolicy


@dataclass(frozen=True)
class SamplingParams:
    """A request's sampling parameters (SGLang's names and defaults)."""

    temperature: float = 1.0
    """<= 0: greedy (argmax; scored at temperature 1)."""
    top_k: int = -1
    """<= 0: no top-k truncation."""
    top_p: float = 1.0
    """>= 1: no top-p truncation."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and 0 < self.top_p <= 1):
            raise ValueError(
                f"sampling params {self}: temperature must be finite and top_p in (0, 1]"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def truncates(self) -> bool:
        """Top-k or top-p changes the support (never for greedy requests)."""
        return not self.greedy and (self.top_k > 0 or self.top_p < 1)

    @property
    def identity(self) -> bool:
        """The processed logits are the logits (cast to the logprob dtype)."""
        return self.greedy or (self.temperature == 1.0 and not self.truncates)


GREEDY = SamplingParams(temperature=0.0)
PLAIN = SamplingParams()


def scale(x_TV: torch.Tensor, params: SamplingParams, kp: KernelPolicy) -> torch.Tensor:
    """``x`` in ``kp.logsoftmax_dtype``, divided by the temperature (float32 division, rounded
    back). Differentiable; elementwise, so a vocab shard's columns equal the whole row's."""
    ld = dtype_of(kp.logsoftmax_dtype)
    x = x_TV.to(ld)
    if params.greedy or params.temperature == 1.0:
        return x
    cd = torch.promote_types(ld, torch.float32)
    return (x.to(cd) / torch.tensor(params.temperature, dtype=torch.float32)).to(ld)


def keep_mask(scaled_TV: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[T, V]`` bool: the tokens top-k / top-p keep, from whole rows of ``scale``'s output
    (all True when nothing truncates). The arithmetic is on the CPU in float64, so every side gets
    the same set. The sort runs where the row is (a GPU sorts a vocab row in well under a
    millisecond, the CPU in about 18): a stable descending sort is one permutation whatever runs
    it, and the values it moves are copied, not computed."""
    if not params.truncates:
        return torch.ones(scaled_TV.shape, dtype=torch.bool)
    x_dev = scaled_TV.detach().to(torch.float64)  # exact: bf16 and float32 widen losslessly
    ranked = torch.sort(x_dev, dim=-1, descending=True, stable=True)  # ties: lower id first
    order, sorted_x = ranked.indices.cpu(), ranked.values.cpu()
    T, V = sorted_x.shape
    keep_sorted = torch.ones(T, V, dtype=torch.bool)
    if params.top_k > 0:
        keep_sorted[:, params.top_k :] = False
    if params.top_p < 1:
        w = torch.exp(sorted_x - sorted_x[:, :1]) * keep_sorted
        # one running sum along each row, its last entry the total: a row's bits do not depend
        # on how many rows come with it (``sum`` splits a lone row over threads, not a batch's)
        running = torch.cumsum(w, dim=-1)
        before = (running - w) / running[:, -1:]  # renormalised mass of the more likely tokens
        keep_sorted &= before < params.top_p
    keep = torch.zeros(T, V, dtype=torch.bool)
    keep.scatter_(-1, order, keep_sorted)
    return keep


def process(
    x_TV: torch.Tensor,
    params: SamplingParams,
    kp: KernelPolicy,
    keep_TV: torch.Tensor | None = None,
) -> torch.Tensor:
    """The processed logits (see the module docstring); ``keep_TV`` (this shard's columns of
    ``keep_mask``) is required for truncating params when ``x_TV`` is a vocab shard."""
    x = scale(x_TV, params, kp)
    if not params.truncates:
        return x
    if keep_TV is None:
        keep_TV = keep_mask(x, params)
    return torch.where(keep_TV.to(x.device), x, torch.full_like(x, -math.inf))


def process_shard(
    x_TVl: torch.Tensor,
    params: SamplingParams,
    kp: KernelPolicy,
    vocab_start: int,
    vocab_size: int,
    group=None,
) -> torch.Tensor:
    """``process`` of a vocab shard (columns ``vocab_start ..`` of ``vocab_size``; the trainer's
    vocab-parallel logits). Differentiable. Truncating params gather the scaled rows whole over
    ``group`` (exact: bits moved, never added) for ``keep_mask``; every rank of the group calls
    it with the same rows and params."""
    x = scale(x_TVl, params, kp)
    if not params.truncates:
        return x
    d = x.detach()
    whole = torch.cat(all_gather_exact(d, group), dim=1) if world_size(group) > 1 else d
    keep = keep_mask(whole[:, :vocab_size], params)
    T, Vl = x.shape
    real = max(0, min(Vl, vocab_size - vocab_start))
    keep_local = torch.zeros(T, Vl, dtype=torch.bool)
    keep_local[:, :real] = keep[:, vocab_start : vocab_start + real]
    return torch.where(keep_local.to(x.device), x, torch.full_like(x, -math.inf))


def process_rows(
    x_TVl: torch.Tensor,
    seq_T: torch.Tensor,
    params: tuple[SamplingParams, ...],
    kp: KernelPolicy,
    vocab_start: int,
    vocab_size: int,
    group=None,
) -> torch.Tensor:
    """``process_shard`` of rows from several sequences: row ``t`` under ``params[seq_T[t]]``
    (``seq_T`` non-decreasing, as a packed batch's scored rows are). Differentiable."""
    seq = seq_T.cpu()
    if seq.numel() > 1 and bool((seq[1:] < seq[:-1]).any()):
        raise ValueError("process_rows: rows must be grouped by sequence, in sequence order")
    parts, lo = [], 0
    for j, n in zip(*torch.unique_consecutive(seq, return_counts=True), strict=True):
        n = int(n)
        parts.append(
            process_shard(x_TVl[lo : lo + n], params[int(j)], kp, vocab_start, vocab_size, group)
        )
        lo += n
    if not parts:
        return scale(x_TVl, PLAIN, kp)
    return torch.cat(parts)
