"""Decode steps on static buffers, replayed as one CUDA graph per batch bucket.

A step of ``B`` running requests is padded to the next bucket (a power of two) and run on the
bucket's own buffers: the token ids and a metadata block ``[4, bucket]`` (token, position,
destination row, first key row), filled by ONE host-to-device copy per step and read by every
layer. The KV cache is a static ``KVPool`` (``KVPool.static``: one address for the whole run), RoPE
rows come from a table computed once, and attention is ``decode_attention`` (no value read on the
host, a fixed chunk count). So nothing in the layer loop syncs with the host, and on CUDA the
whole step (28 layers of Qwen3-0.6B, the LM head) is captured once per bucket and replayed. On
CPU, and with ``graphs=False``, the same code runs eagerly: what the CPU tests check.

Padding rows decode token 0 at position 0 against a scratch row of their own (the pool's last
``max_batch`` rows), so they read and write no request's keys; the kernels are batch invariant
(every row's bits depend on its own inputs only), so they change no real row's bits
(``tests/sglang/test_decode_graph.py`` checks it against the packed forward, bit for bit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..kernels._dtypes import dtype_of
from ..kernels.attention import decode_attention
from ..kernels.rope import rope_cos_sin
from .model import KVCache, KVPool, ReferenceModel


def bucket_for(n: int) -> int:
    """The batch bucket of ``n`` requests: the next power of two (1, 2, 4, ..., 32, 64, ...)."""
    return 1 << max(0, (n - 1).bit_length())


def unsupported(model: ReferenceModel) -> str | None:
    """Why ``model`` cannot decode on static buffers (None: it can). A TP group runs collectives
    that a graph of one rank cannot hold; an MoE block routes tokens on the host; a stock op
    (or a stock LoRA matmul, a fault only) is not batch invariant."""
    if model.tp > 1:
        return f"TP={model.tp}: the decode graph runs one rank"
    if any(mlp != model._dense_mlp for mlp in model.mlps):
        return f"{model.arch.name} has MoE layers (routing reads values on the host)"
    if stock := sorted(name for name, on in model.ops.switches.items() if not on):
        return (
            f"the runtime policy selects stock ops ({', '.join(stock)}), which are not batch "
            "invariant: a padded bucket would change their bits"
        )
    if model.lora and model.kp.lora_matmul != "invariant":
        return (
            f"the LoRA path's matmul is {model.kp.lora_matmul!r}, not batch invariant: a padded "
            "bucket would change its bits"
        )
    return None


@dataclass
class _Bucket:
    """One bucket's static buffers (and, on CUDA, its captured graph)."""

    meta: torch.Tensor  # [4, size] int64 on the device: token, position, dst row, first key row
    host: torch.Tensor  # the same on the host (pinned on CUDA): filled, then copied in one go
    logits: torch.Tensor | None = None  # [size, vocab]: the step's output
    graph: torch.cuda.CUDAGraph | None = None
    copied: torch.cuda.Event | None = None  # the last host-to-device copy of ``host`` (CUDA)


class DecodeRunner:
    """Decode steps of one model over a static KV pool (``KVPool.static``) of ``rows`` rows, for
    requests of at most ``max_keys`` tokens and at most ``max_batch`` at a time. ``graphs``:
    capture and replay one CUDA graph per bucket (CUDA only); otherwise run the same static step
    eagerly."""

    def __init__(
        self,
        model: ReferenceModel,
        *,
        rows: int,
        max_keys: int,
        max_batch: int,
        graphs: bool | None = None,
    ):
        if why := unsupported(model):
            raise ValueError(f"static decode is not available: {why}")
        a = model.arch
        self.model, self.max_keys = model, max_keys
        self.device = model.embed.device
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        if self.graphs and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model (this one is on {self.device})")
        self.max_batch = bucket_for(max_batch)
        dense = dtype_of(model.kp.dense_math_dtype)
        self.pool = KVPool.static(
            len(model.layers), rows + self.max_batch, model.kvl, a.head_dim, dense, self.device
        )
        self.scratch = self.pool.reserve(self.max_batch)  # the padding rows' own key rows
        # one RoPE row per position, computed once (each row depends on its position only)
        positions = torch.arange(max_keys, device=self.device)
        self.cos, self.sin = rope_cos_sin(
            positions,
            a.head_dim,
            a.rope_theta,
            a.rope_scaling,
            model.kp,
            max_position=a.max_position_embeddings,
        )
        self.buckets: dict[int, _Bucket] = {}
        self.mempool = torch.cuda.graph_pool_handle() if self.graphs else None
        # captures on a stream of the model's device (torch's default capture stream belongs to
        # whichever device was current at a process's first capture)
        self.capture_stream = torch.cuda.Stream(self.device) if self.graphs else None

    def fits(self, max_keys: int, max_batch: int) -> bool:
        """Whether this runner serves requests of ``max_keys`` tokens, ``max_batch`` at a time."""
        return max_keys <= self.max_keys and bucket_for(max_batch) <= self.max_batch

    def reset(self) -> None:
        """Free every region but the padding rows' (a run that stopped early leaves its own)."""
        self.pool.regions = {self.scratch: self.max_batch}

    def step(self, tokens: Sequence[int], caches: Sequence[KVCache]) -> torch.Tensor:
        """Decode ``tokens[i]`` for ``caches[i]`` (each in this runner's pool, with room for one
        row); returns logits ``[len(caches), vocab]`` and appends one row to every cache. Runs
        with the model's device current (events, streams and captures are the current device's)."""
        cuda = self.device.type == "cuda"
        with torch.cuda.device(self.device) if cuda else contextlib.nullcontext():
            return self._step(tokens, caches)

    def _step(self, tokens: Sequence[int], caches: Sequence[KVCache]) -> torch.Tensor:
        n = len(caches)
        if not 0 < n <= self.max_batch:
            raise ValueError(
                f"a decode step of {n} requests (this runner holds 1..{self.max_batch})"
            )
        size = bucket_for(n)
        b = self.buckets.get(size) or self._bucket(size)
        pad = range(self.scratch, self.scratch + size - n)
        if b.copied is not None:  # the previous step's copy has read ``host``
            b.copied.synchronize()
        b.host[0, :n] = torch.tensor(list(tokens))
        b.host[1, :n] = torch.tensor([c.length for c in caches])
        b.host[2, :n] = torch.tensor([c.start + c.length for c in caches])
        b.host[3, :n] = torch.tensor([c.start for c in caches])
        if size > n:
            b.host[0:2, n:] = 0
            b.host[2, n:] = b.host[3, n:] = torch.tensor(list(pad))
        if int(b.host[1, :n].max()) >= self.max_keys:
            raise ValueError(f"a request passed this runner's {self.max_keys} positions")
        b.meta.copy_(b.host, non_blocking=True)
        if self.device.type == "cuda":
            b.copied = b.copied or torch.cuda.Event()
            b.copied.record()
        if b.graph is not None:
            b.graph.replay()
        else:
            self._compute(b)
        for c in caches:
            c.length += 1
        return b.logits[:n].clone()

    def _compute(self, b: _Bucket) -> None:
        """The step on ``b``'s buffers: every shape is the bucket's, nothing read on the host."""
        m, kp, pool = self.model, self.model.kp, self.pool
        ids, pos, dst, k0 = b.meta
        cos, sin = self.cos[pos], self.sin[pos]

        def attend(i: int, q, k, v) -> torch.Tensor:
            k_pool, v_pool = pool.write(i, dst, k, v)
            return decode_attention(q, k_pool, v_pool, pos, k0, kp, max_keys=self.max_keys)

        h = m.embed[ids].to(dtype_of(kp.residual_dtype))
        logits = m.head(m.decoder(h, cos, sin, attend))
        if b.logits is None:
            b.logits = torch.empty_like(logits)
        b.logits.copy_(logits)

    def _bucket(self, size: int) -> _Bucket:
        """The buffers of a new bucket; on CUDA, its graph captured after two warm-up steps (which
        fill the weights' tile caches and compile the kernels). Warm-up and capture run on the
        padding rows only, so no request's keys are written."""
        host = torch.zeros((4, size), dtype=torch.int64, pin_memory=self.device.type == "cuda")
        host[2] = host[3] = torch.arange(self.scratch, self.scratch + size)
        b = _Bucket(meta=host.to(self.device), host=host)
        self.buckets[size] = b
        if not self.graphs:
            return b
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._compute(b)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool, stream=self.capture_stream):
            self._compute(b)
        b.graph = graph
        return b
