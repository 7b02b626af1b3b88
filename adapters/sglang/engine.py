"""Reference rollout: continuous batching over the reference model with per-request KV caches.

Every step runs ONE packed forward holding the prompts of requests joining at that step (prefill)
and the last token of every running request (decode); requests finish at different steps. Greedy
or seeded sampling (``sampling``: temperature, top-k, top-p; Gumbel-max with a per-request
generator, so a request's draws never depend on its neighbours). Each sampled token comes with its
logprob as the sampler saw it (the processed distribution it was drawn from, the contract's dtype).
``rescore`` is one prefill pass over a finished sequence: the public ``sglang_prefill`` contract;
given the requests' sampling params it scores the same processed distribution.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .kernels.logsoftmax import token_logprobs
from .model import KVCache, ReferenceModel
from .sampling import SamplingParams, process, sample


@dataclass(frozen=True)
class Request:
    rid: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    temperature: float = 0.0  # 0: greedy
    seed: int = 0
    arrival_step: int = 0
    stop_token_ids: tuple[int, ...] = ()
    top_k: int = -1  # <= 0: off
    top_p: float = 1.0  # 1: off

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


@dataclass
class Completion:
    rid: str
    prompt: tuple[int, ...]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[torch.Tensor] = field(default_factory=list)  # 0-dim, kp.logsoftmax_dtype
    first_step: int = -1
    finish_step: int = -1

    @property
    def sequence(self) -> list[int]:
        return [*self.prompt, *self.tokens]

    def logprob_tensor(self) -> torch.Tensor:
        return torch.stack(self.logprobs) if self.logprobs else torch.zeros(0)


class _Progress:
    """One stderr line every ``every`` seconds once a run has lasted ``after`` seconds."""

    def __init__(self, label: str, enabled: bool = True, after: float = 3.0, every: float = 2.0):
        self.label, self.enabled, self.after, self.every = label, enabled, after, every
        self.t0 = self.last = time.monotonic()

    def __call__(self, msg: str) -> None:
        now = time.monotonic()
        if self.enabled and now - self.t0 >= self.after and now - self.last >= self.every:
            self.last = now
            print(f"{self.label}: {msg} ({now - self.t0:.1f} s)", file=sys.stderr, flush=True)


class RolloutEngine:
    def __init__(self, model: ReferenceModel, *, progress: bool = True):
        self.model, self.progress = model, progress

    @property
    def kp(self):
        return self.model.kp

    def generate(self, requests: Sequence[Request]) -> dict[str, Completion]:
        """Run all requests to completion; returns completions by request id."""
        V = self.model.arch.vocab_size
        self._check(requests)
        pending = sorted(requests, key=lambda r: (r.arrival_step, r.rid))
        done: dict[str, Completion] = {}
        running: list[tuple[Request, Completion, KVCache, torch.Generator]] = []
        pool = self.model.new_kv_pool()  # every request's keys and values, preallocated
        prog = _Progress("rollout", self.progress)
        step = 0
        while pending or running:
            if not running and pending and pending[0].arrival_step > step:
                step = pending[0].arrival_step
            joining = [r for r in pending if r.arrival_step <= step]
            pending = [r for r in pending if r.arrival_step > step]
            for r in joining:
                gen = torch.Generator().manual_seed(r.seed)
                cache = KVCache(capacity_hint=len(r.prompt) + r.max_new_tokens, pool=None)
                cache.make_room(pool, 0)
                running.append((r, Completion(r.rid, tuple(r.prompt), first_step=step), cache, gen))
            ids, lens = [], []
            for r, c, cache, _ in running:
                new = list(r.prompt) if cache.length == 0 else [c.tokens[-1]]
                ids.extend(new)
                lens.append(len(new))
            logits = self.model.forward(torch.tensor(ids), [x[2] for x in running], lens)
            still = []
            for row, (r, c, cache, gen) in enumerate(running):
                tok, lp = sample(logits[row], r.sampling, self.kp, V, gen)
                c.tokens.append(tok)
                c.logprobs.append(lp)
                if len(c.tokens) >= r.max_new_tokens or tok in r.stop_token_ids:
                    c.finish_step = step
                    done[r.rid] = c
                    cache.release()
                else:
                    still.append((r, c, cache, gen))
            running = still
            step += 1
            prog(f"step {step}, {len(running)} running, {len(pending)} waiting, {len(done)} done")
        return done

    def _check(self, requests: Sequence[Request]) -> None:
        """Refuse requests the model cannot serve, naming the request and the limit."""
        arch = self.model.arch
        seen: set[str] = set()
        for r in requests:
            if r.rid in seen:
                raise ValueError(f"request id {r.rid!r} is used twice")
            seen.add(r.rid)
            if not r.prompt or r.max_new_tokens < 1:
                raise ValueError(
                    f"request {r.rid!r}: needs a non-empty prompt and max_new_tokens >= 1"
                )
            try:
                r.sampling  # noqa: B018 (validates the params)
            except ValueError as exc:
                raise ValueError(f"request {r.rid!r}: {exc}") from None
            if bad := [t for t in r.prompt if not 0 <= t < arch.vocab_size]:
                raise ValueError(
                    f"request {r.rid!r}: token ids {bad[:3]} outside [0, {arch.vocab_size})"
                )
            total = len(r.prompt) + r.max_new_tokens
            if arch.max_position_embeddings and total > arch.max_position_embeddings:
                raise ValueError(
                    f"request {r.rid!r}: prompt {len(r.prompt)} + max_new_tokens {r.max_new_tokens} "
                    f"exceeds max_position_embeddings={arch.max_position_embeddings} of {arch.name}"
                )

    def _scored(self, logits_TV, ids_T, params: SamplingParams | None) -> torch.Tensor:
        """Logprobs of ``ids`` under ``params``' processed distribution (none: the logits')."""
        V = self.model.arch.vocab_size
        if params is not None and not params.identity:
            logits_TV = process(logits_TV[:, :V], params, self.kp)
        return token_logprobs(logits_TV, ids_T, self.kp, V)

    def rescore(
        self,
        sequence: Sequence[int],
        *,
        layer_outputs: list | None = None,
        params: SamplingParams | None = None,
    ) -> torch.Tensor:
        """Logprob of ``sequence[t+1]`` given ``sequence[:t+1]`` for every t, from ONE prefill
        (of ``params``' processed distribution: the one the sequence's tokens were drawn from)."""
        ids = torch.tensor(list(sequence), device=self.model.embed.device)
        logits = self.model.forward(
            ids, [KVCache()], [len(ids)], all_logits=True, layer_outputs=layer_outputs
        )
        return self._scored(logits[:-1], ids[1:], params)

    def rescore_many(
        self,
        sequences: Sequence[Sequence[int]],
        params: Sequence[SamplingParams | None] | None = None,
    ) -> list[torch.Tensor]:
        """``rescore`` of every sequence from ONE packed prefill (each its own segment, so its
        own positions and attention span). The kernels are batch invariant, so each sequence's
        bits equal its own ``rescore``'s (``tests/sglang`` checks it)."""
        if not sequences:
            return []
        dev = self.model.embed.device
        ids = [torch.tensor(list(s), device=dev) for s in sequences]
        lens = [len(s) for s in sequences]
        per_seq = list(params) if params is not None else [None] * len(ids)
        logits = self.model.forward(torch.cat(ids), [KVCache() for _ in ids], lens, all_logits=True)
        out, lo = [], 0
        for seq_ids, n, p in zip(ids, lens, per_seq, strict=True):
            out.append(self._scored(logits[lo : lo + n - 1], seq_ids[1:], p))
            lo += n
        return out

    def logits(self, sequence: Sequence[int]) -> torch.Tensor:
        """All-position logits of one prefill (for reference comparisons)."""
        ids = torch.tensor(list(sequence))
        return self.model.forward(ids, [KVCache()], [len(ids)], all_logits=True)
