"""Reference rollout: continuous batching over the reference model with per-request KV caches.

Every step runs ONE packed forward holding the prompts of requests joining at that step (prefill)
and the last token of every running request (decode); requests finish at different steps. Greedy
or seeded sampling (``sampling``: temperature, top-k, top-p; Gumbel-max with noise keyed by the
request's seed and the draw's index, so a request's draws never depend on its neighbours). A step's
rows are sampled together on their device (``sampling.sample_rows``) and its tokens read with one
host sync. Each sampled token comes with its logprob as the sampler saw it (the processed
distribution it was drawn from, the contract's dtype).
``rescore`` is one prefill pass over a finished sequence: the public ``sglang_prefill`` contract;
given the requests' sampling params it scores the same processed distribution.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..common.draw import SamplingParams, draw_key, draw_keys, process, sample_rows
from ..common.rollout import Request
from ..kernels import audit
from ..kernels._dtypes import dtype_of
from ..kernels.logsoftmax import token_logprobs
from .decode_graph import DecodeRunner, unsupported
from .model import KVCache, ReferenceModel


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


# Logits elements a re-score holds at once (``rescore_many``): 64 Mi, 256 MB in float32
_HEAD_BLOCK_ELEMENTS = 1 << 26

# ``RolloutEngine(decode=...)``: how running requests decode
DECODE_MODES = {
    "auto": "graph on CUDA where the model allows it (one rank, dense, not recording), else eager",
    "eager": "one packed forward per step: joining prompts and running requests together",
    "static": "prefill packed, decode on static buffers in batch buckets, run eagerly",
    "graph": "as static, each bucket's step captured once as a CUDA graph and replayed",
}


class RolloutEngine:
    """Continuous batching over ``model``; ``decode`` picks how running requests decode
    (``DECODE_MODES``). Every mode gives the same bits (``tests/sglang/test_decode_graph.py``)."""

    def __init__(self, model: ReferenceModel, *, progress: bool = True, decode: str = "auto"):
        if decode not in DECODE_MODES:
            raise ValueError(
                f"decode={decode!r} is not a decode mode; known: {sorted(DECODE_MODES)}"
            )
        self.model, self.progress, self.decode = model, progress, decode
        self._runner: DecodeRunner | None = None

    def decode_mode(self) -> str:
        """The mode ``generate`` runs: ``decode``, with ``auto`` resolved for this model."""
        if self.decode != "auto":
            return self.decode
        cuda = self.model.embed.device.type == "cuda"
        usable = cuda and unsupported(self.model) is None and not audit.recording_on()
        return "graph" if usable else "eager"

    def _decode_runner(self, requests: Sequence[Request]) -> DecodeRunner | None:
        """The static decode runner for ``requests`` (None: eager), kept between runs while it
        fits them (a new one recaptures its graphs)."""
        mode = self.decode_mode()
        if mode == "eager":
            return None
        if why := unsupported(self.model):
            raise ValueError(f"decode={mode!r}: {why}")
        rows = sum(len(r.prompt) + r.max_new_tokens for r in requests)
        max_keys = max(len(r.prompt) + r.max_new_tokens for r in requests)
        runner = self._runner
        graphs = mode == "graph"
        if (
            runner is None
            or runner.graphs != graphs
            or not runner.fits(max_keys, len(requests))
            or runner.pool.rows - runner.max_batch < rows
        ):
            runner = DecodeRunner(
                self.model, rows=rows, max_keys=max_keys, max_batch=len(requests), graphs=graphs
            )
        runner.reset()
        self._runner = runner
        return runner

    @property
    def kp(self):
        return self.model.kp

    def generate(self, requests: Sequence[Request]) -> dict[str, Completion]:
        """Run all requests to completion; returns completions by request id."""
        V = self.model.arch.vocab_size
        self._check(requests)
        pending = sorted(requests, key=lambda r: (r.arrival_step, r.rid))
        done: dict[str, Completion] = {}
        running: list[tuple[Request, Completion, KVCache]] = []
        runner = self._decode_runner(requests) if requests else None
        # every request's keys and values, preallocated (static: allocated once, never moved)
        pool = runner.pool if runner is not None else self.model.new_kv_pool()
        prog = _Progress("rollout", self.progress)
        dev = self.model.embed.device
        step = 0
        while pending or running:
            if not running and pending and pending[0].arrival_step > step:
                step = pending[0].arrival_step
            joining = [r for r in pending if r.arrival_step <= step]
            pending = [r for r in pending if r.arrival_step > step]
            for r in joining:
                cache = KVCache(capacity_hint=len(r.prompt) + r.max_new_tokens, pool=None)
                cache.make_room(pool, 0)
                running.append((r, Completion(r.rid, tuple(r.prompt), first_step=step), cache))
            # the draw keys go to the device before the step's work is queued (nothing to wait for)
            keys = draw_keys([draw_key(r.seed, len(c.tokens)) for r, c, _ in running], dev)
            if runner is None:
                logits = self._packed_step(running)
            else:
                logits = self._split_step(running, runner)
            params = [r.sampling for r, _, _ in running]
            tok_B, lp_B = sample_rows(logits, params, keys, self.kp, V)
            still = []
            for row, (tok, (r, c, cache)) in enumerate(zip(tok_B.tolist(), running, strict=True)):
                c.tokens.append(tok)
                c.logprobs.append(lp_B[row])
                if len(c.tokens) >= r.max_new_tokens or tok in r.stop_token_ids:
                    c.finish_step = step
                    done[r.rid] = c
                    cache.release()
                else:
                    still.append((r, c, cache))
            running = still
            step += 1
            prog(f"step {step}, {len(running)} running, {len(pending)} waiting, {len(done)} done")
        return done

    def _packed_step(self, running) -> torch.Tensor:
        """One packed forward: the prompts of joining requests and the last token of the others."""
        ids, lens = [], []
        for r, c, cache in running:
            new = list(r.prompt) if cache.length == 0 else [c.tokens[-1]]
            ids.extend(new)
            lens.append(len(new))
        return self.model.forward(torch.tensor(ids), [x[2] for x in running], lens)

    def _split_step(self, running, runner: DecodeRunner) -> torch.Tensor:
        """Joining requests' prompts in one packed prefill, the others in one static decode step;
        logits ``[len(running), vocab]`` in ``running``'s order (the kernels are batch invariant:
        the same bits as ``_packed_step``)."""
        new = [i for i, x in enumerate(running) if x[2].length == 0]
        old = [i for i, x in enumerate(running) if x[2].length > 0]
        parts: list[tuple[list[int], torch.Tensor]] = []
        if new:
            ids = torch.tensor([t for i in new for t in running[i][0].prompt])
            lens = [len(running[i][0].prompt) for i in new]
            parts.append((new, self.model.forward(ids, [running[i][2] for i in new], lens)))
        if old:
            caches = [running[i][2] for i in old]
            for cache in caches:
                cache.make_room(runner.pool, 1)
            parts.append((old, runner.step([running[i][1].tokens[-1] for i in old], caches)))
        if len(parts) == 1 and parts[0][0] == list(range(len(running))):
            return parts[0][1]
        first = parts[0][1]
        out = first.new_empty((len(running), first.shape[1]))
        for rows, logits in parts:
            out[torch.tensor(rows).to(out.device, non_blocking=True)] = logits
        return out

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
        h = self.model.forward(torch.cat(ids), [KVCache() for _ in ids], lens, hidden=True)
        # the logits exist a block of rows at a time (``head`` and the log-softmax are per row,
        # so the bits are the whole ``[tokens, vocab]`` tensor's): a step's re-score of 128
        # sequences of 300 tokens would otherwise hold 23 GB of float32 logits at once
        block = max(1, _HEAD_BLOCK_ELEMENTS // self.model.arch.vocab_size)
        out, lo = [], 0
        for seq_ids, n, p in zip(ids, lens, per_seq, strict=True):
            parts = [
                self._scored(
                    self.model.head(h[a : min(a + block, lo + n - 1)]),
                    seq_ids[a - lo + 1 : min(a + block, lo + n - 1) - lo + 1],
                    p,
                )
                for a in range(lo, lo + n - 1, block)
            ]
            out.append(torch.cat(parts) if parts else h.new_zeros(0, dtype=self._lp_dtype))
            lo += n
        return out

    @property
    def _lp_dtype(self) -> torch.dtype:
        return dtype_of(self.kp.logsoftmax_dtype)

    def logits(self, sequence: Sequence[int]) -> torch.Tensor:
        """All-position logits of one prefill (for reference comparisons)."""
        ids = torch.tensor(list(sequence))
        return self.model.forward(ids, [KVCache()], [len(ids)], all_logits=True)
