"""The contract's sampler draw, one for every rollout target: draws from the processed distribution
(``common/sampling.py``, which every side scores) with the request's per-sample keys.

``draw_rows`` is Gumbel-max over the processed logprobs: ``argmax(lp + g)``, ``g = -log(-log(u))``,
which samples from ``softmax(lp)``; the logprob reported for the drawn token is read from the same
tensor it drew from. ``u`` is a counter-based hash (``hash_bits``) of the request's seed, the
draw's index within the request (its n-th new token) and the token id, computed on the rows'
device in exact integer arithmetic. Why a hash and not a per-request ``torch.Generator``:

- it is per request by construction: a row's noise is a pure function of (seed, index, token
  id), never of the rows beside it, the batch's order or size, or how many draws came before;
- its 32 bits are the same on every device (integer ops, no device generator: CUDA's Philox
  maps elements to threads by the GPU's SM count), so TP ranks on any GPUs agree, and a CPU
  test pins what a GPU draws up to the float64 ``log``;
- a whole step's rows draw in one pass of tensor ops, with no generator state to carry in the
  engine across steps or runs.

``u = (h + 0.5) / 2**32`` has 32 random bits (SGLang's own sampler draws float32 uniforms: 24);
``g`` lies in [-3.2, 22.9], so a token more than ~26 nats below the row's best is never drawn (a
bias below 1e-11 per draw).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from ..kernels.policy import KernelPolicy
from .sampling import (  # noqa: F401 (the processed distribution, named here too)
    GREEDY,
    PLAIN,
    SamplingParams,
    keep_mask,
    process,
    process_rows,
    process_shard,
    scale,
)

_M32 = (1 << 32) - 1
_M64 = (1 << 64) - 1
# The 32-bit finaliser of ``hash_bits`` (Wellons' hash-prospector "lowbias32", the variant
# whose two multipliers are below 2**31): with ``h < 2**32`` every product stays below 2**63, so
# int64 tensors compute it exactly (no wrap-around) on every device.
_MUL = (0x21F0AAAD, 0x735A2D97)
_SHIFTS = (16, 15, 15)
_TOKEN_MUL = 0x9E3779B1  # token id * this, mod 2**32 (ids < 2**31: exact in int64)


def _mix64(x: int) -> int:
    """SplitMix64's finaliser on a Python int (exact; host side)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def draw_key(seed: int, index: int) -> tuple[int, int]:
    """The two 32-bit words that key the ``index``-th draw of a request seeded ``seed``."""
    k = _mix64(_mix64(seed & _M64) ^ (index & _M64))
    return k & _M32, k >> 32


def _lowbias32_(h: torch.Tensor) -> torch.Tensor:
    """``lowbias32`` of int64 values in [0, 2**32), in place and exact (see ``_MUL``)."""
    h.bitwise_xor_(h >> _SHIFTS[0])
    h.mul_(_MUL[0]).bitwise_and_(_M32)
    h.bitwise_xor_(h >> _SHIFTS[1])
    h.mul_(_MUL[1]).bitwise_and_(_M32)
    return h.bitwise_xor_(h >> _SHIFTS[2])


@functools.cache
def _token_hash(vocab_size: int, device: torch.device) -> torch.Tensor:
    """``[vocab_size]`` int64: ``lowbias32(id * _TOKEN_MUL mod 2**32)`` of every token id (the
    same for every row and step: made once per vocab and device)."""
    ids = torch.arange(vocab_size, device=device, dtype=torch.int64)
    return _lowbias32_(ids.mul_(_TOKEN_MUL).bitwise_and_(_M32))


def hash_bits(keys_B2: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[B, vocab_size]`` int64 in [0, 2**32): the hash of each row's key (``draw_key``) and
    each token id, ``lowbias32(lowbias32(token_hash ^ k1) ^ k2)``. Row ``b`` depends on
    ``keys_B2[b]`` alone. Written in place: one ``[B, V]`` tensor, about 20 passes over it."""
    h = _token_hash(vocab_size, keys_B2.device)[None, :] ^ keys_B2[:, :1]
    return _lowbias32_(_lowbias32_(h).bitwise_xor_(keys_B2[:, 1:]))


def gumbel_noise(keys_B2: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[B, vocab_size]`` float64 ``-log(-log(u))``, ``u = (hash_bits + 0.5) / 2**32`` in
    (0, 1) (exact in float64), computed in place."""
    u = hash_bits(keys_B2, vocab_size).to(torch.float64).add_(0.5).mul_(2.0**-32)
    return u.log_().neg_().log_().neg_()


def draw_keys(keys: Sequence[tuple[int, int]], device=None) -> torch.Tensor:
    """``[B, 2]`` int64 of ``draw_key`` pairs on ``device``. The copy does not wait for the
    device's queued work (an engine makes it before the step's forward is queued)."""
    return torch.tensor(list(keys), dtype=torch.int64).reshape(-1, 2).to(device, non_blocking=True)


def draw_rows(lp_BV: torch.Tensor, params: SamplingParams, keys_B2: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64 token ids on ``lp_BV``'s device, one per row of processed logprobs (all
    rows under ``params``): argmax for greedy, else Gumbel-max with row ``b``'s noise keyed by
    ``keys_B2[b]`` (``draw_keys``). No host sync."""
    if params.greedy:
        return torch.argmax(lp_BV, dim=-1)
    noisy = gumbel_noise(keys_B2.to(lp_BV.device), lp_BV.shape[-1])
    return torch.argmax(noisy.add_(lp_BV.detach()), dim=-1)  # lp + g, in float64


def draw(lp_V: torch.Tensor, params: SamplingParams, seed: int, index: int) -> int:
    """One token from the processed logprobs of one row (``draw_rows`` of that row alone)."""
    return int(draw_rows(lp_V[None], params, draw_keys([draw_key(seed, index)]))[0])


def sample_rows(
    logits_BV: torch.Tensor,
    params: Sequence[SamplingParams],
    keys_B2: torch.Tensor,
    kp: KernelPolicy,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens [B] int64, their logprobs [B] in kp.logsoftmax_dtype)`` on the rows' device, for
    rows of whole-vocab logits, row ``b`` under ``params[b]`` with draw key ``keys_B2[b]``
    (``draw_keys``): per group of rows sharing params, ONE contract log-softmax of the processed
    logits (batch invariant: each row's bits are its lone computation's), the draw, and that
    tensor's entries. Only the rows that truncate go through ``keep_mask`` (which reads them on
    the host). Otherwise no host sync: the caller reads the tokens."""
    from ..kernels.logsoftmax import full_logprobs

    B, dev = logits_BV.shape[0], logits_BV.device
    groups: dict[SamplingParams, list[int]] = {}
    for b, p in enumerate(params):
        groups.setdefault(p, []).append(b)
    toks, lps = [], []
    for p, rows in groups.items():
        if len(rows) == B:
            x, k = logits_BV[:, :vocab_size], keys_B2
        else:
            idx = torch.tensor(rows).to(dev, non_blocking=True)
            x, k = logits_BV[idx, :vocab_size], keys_B2.to(dev)[idx]
        lp_BV = full_logprobs(process(x, p, kp), kp, vocab_size)
        tok = draw_rows(lp_BV, p, k)
        toks.append(tok)
        lps.append(lp_BV.gather(-1, tok[:, None])[:, 0])
    if len(groups) == 1:
        return toks[0], lps[0]
    order = torch.tensor([b for rows in groups.values() for b in rows]).to(dev, non_blocking=True)
    tok_B = torch.empty(B, dtype=torch.int64, device=dev)
    lp_B = torch.empty(B, dtype=lps[0].dtype, device=dev)
    tok_B[order] = torch.cat(toks)
    lp_B[order] = torch.cat(lps)
    return tok_B, lp_B


def sample(
    logits_V: torch.Tensor,
    params: SamplingParams,
    kp: KernelPolicy,
    vocab_size: int,
    seed: int,
    index: int,
) -> tuple[int, torch.Tensor]:
    """``(token, its logprob as the sampler saw it)`` for one row of whole-vocab logits
    (``sample_rows`` of that row alone)."""
    keys = draw_keys([draw_key(seed, index)], logits_V.device)
    tok, lp = sample_rows(logits_V[None], [params], keys, kp, vocab_size)
    return int(tok[0]), lp[0]
