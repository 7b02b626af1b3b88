"""Bitwise comparison of scored logprobs: bit patterns (``bits``: +0.0 is not -0.0), their
digest, and the per-pair ``Comparison``. A leaf module: the harness, the training loop and the
correctness checks all import it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass
class Comparison:
    exact: bool
    """Every scored logprob has the same bit pattern on both sides, and there was one at least."""
    tokens_compared: int
    max_abs_diff: float
    first: tuple[int, int] | None  # (sequence, scored token) of the first difference


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bit patterns as signed integers of its width: +0.0 and -0.0 differ, as do NaNs of
    other payloads (``torch.equal`` on the values calls the first equal and every NaN unequal)."""
    return t.contiguous().view(INT_OF_WIDTH[t.element_size()])


INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_digest(logprobs: list[torch.Tensor]) -> str:
    """sha256 of the logprobs' bit patterns, sequence by sequence (dtype and shape included): two
    runs with one digest scored every token with the same bits (a refactor's before/after too)."""
    h = hashlib.sha256()
    for t in logprobs:
        t = t.detach().cpu()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        h.update(bits(t).numpy().tobytes())
    return h.hexdigest()


def compare(rollout: list[torch.Tensor], trainer: list[torch.Tensor]) -> Comparison:
    """Bit-pattern comparison of per-sequence scored logprobs (dtype included). Nothing to
    compare is not exact: an empty comparison proves nothing."""
    n, worst, first, exact = 0, 0.0, None, True
    for i, (a, b) in enumerate(zip(rollout, trainer, strict=True)):
        n += a.numel()
        if a.shape != b.shape:
            raise ValueError(f"sequence {i}: rollout scored {a.shape}, trainer {b.shape}")
        same = a.dtype == b.dtype and torch.equal(bits(a), bits(b))
        if not same:
            exact = False
            diff = (a.double() - b.double()).abs()
            diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
            worst = max(worst, float(diff.max()))
            if first is None:
                bad = (
                    bits(a) != bits(b) if a.dtype == b.dtype else torch.ones_like(diff, dtype=bool)
                )
                first = (i, int(bad.nonzero()[0, 0]) if bad.any() else 0)
    return Comparison(exact and n > 0, n, worst, first)
