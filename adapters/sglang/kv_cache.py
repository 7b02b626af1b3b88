"""The rollout's per-request state: a preallocated KV pool shared by the requests of a forward or
an engine run, each request's place in it, and a hybrid layer's linear-attention state."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class KVPool:
    """Preallocated post-RoPE keys and values for every layer (``[rows, kv_heads_local, head_dim]``,
    in the dtype of the first rows written), shared by the requests of one forward or one engine
    run. Each request holds one contiguous region of rows. A step writes its new rows in place, and
    attention reads every request's keys where they lie (``k_starts``), so nothing is concatenated
    per step. A request that outgrows its region moves to one twice as large. A pool with no free
    gap grows: new tensors, the rows copied once."""

    def __init__(self, layers: int):
        self.k: list[torch.Tensor | None] = [None] * layers
        self.v: list[torch.Tensor | None] = [None] * layers
        self.rows = 0
        self.regions: dict[int, int] = {}  # start -> rows, of every region in use
        self.fixed = False  # a static pool (``static``) never grows: its tensors never move

    @classmethod
    def static(
        cls, layers: int, rows: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device
    ) -> KVPool:
        """A pool of ``rows`` rows allocated now, ``[rows, kv_heads, head_dim]`` per layer, that
        never grows: every layer's K/V stays at one address (what a captured CUDA graph reads).
        A region that does not fit is refused."""
        pool = cls(layers)
        pool.k = [
            torch.zeros(rows, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(layers)
        ]
        pool.v = [torch.zeros_like(t) for t in pool.k]
        pool.rows, pool.fixed = rows, True
        return pool

    def reserve(self, rows: int) -> int:
        """The first row of a free region of ``rows`` rows (first fit; grows the pool if none)."""
        at = 0
        for start in sorted(self.regions):
            if start - at >= rows:
                break
            at = max(at, start + self.regions[start])
        if at + rows > self.rows:
            self._grow(max(2 * self.rows, at + rows))
        self.regions[at] = rows
        return at

    def release(self, start: int) -> None:
        del self.regions[start]

    def move(self, src: int, dst: int, rows: int) -> None:
        """Copy rows ``src .. src + rows`` to ``dst ..`` in every layer's keys and values."""
        for t in (*self.k, *self.v):
            if t is not None:
                t[dst : dst + rows] = t[src : src + rows]

    def write(self, layer: int, dst: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Put ``k``/``v`` at rows ``dst`` of ``layer``; that layer's whole ``(K, V)``."""
        for t, x in ((self.k, k), (self.v, v)):
            if t[layer] is None:
                t[layer] = x.new_empty((self.rows, *x.shape[1:]))
            t[layer].index_copy_(0, dst, x)
        return self.k[layer], self.v[layer]

    def _grow(self, rows: int) -> None:
        if self.fixed:
            used = sum(self.regions.values())
            raise ValueError(
                f"static KV pool of {self.rows} rows is full ({used} in use): size it for "
                f"{rows} rows (every request's prompt + max_new_tokens, plus the padding rows)"
            )
        for t in (self.k, self.v):
            for i, old in enumerate(t):
                if old is not None:
                    new = old.new_empty((rows, *old.shape[1:]))
                    new[: old.shape[0]] = old
                    t[i] = new
        self.rows = rows


@dataclass
class KVCache:
    """One request's place in a ``KVPool``: rows ``start .. start + length`` of every layer's
    keys and values, in a region of ``capacity`` rows. ``capacity_hint`` (prompt + new tokens)
    sizes the first region; without a pool the forward makes one for the call."""

    capacity_hint: int = 0
    pool: KVPool | None = None
    start: int = 0
    capacity: int = 0
    length: int = 0
    # hybrid families: this request's conv and recurrent state per linear-attention layer
    linear: dict[int, LinearState] = field(default_factory=dict)

    def make_room(self, pool: KVPool, new_rows: int) -> None:
        """Hold ``length + new_rows`` rows in ``pool``: reserve the first region, or move to a
        region twice as large (the rows copied, the old region released)."""
        need = self.length + new_rows
        if self.pool is None:
            self.pool, self.capacity = pool, max(need, self.capacity_hint)
            self.start = pool.reserve(self.capacity)
        elif self.pool is not pool:
            raise ValueError("the caches of one forward must share one KVPool")
        elif need > self.capacity:
            capacity = max(need, 2 * self.capacity)
            start = pool.reserve(capacity)
            pool.move(self.start, start, self.length)
            pool.release(self.start)
            self.start, self.capacity = start, capacity

    def release(self) -> None:
        """Give the region back to the pool (the request is done)."""
        if self.pool is not None:
            self.pool.release(self.start)
            self.pool, self.capacity, self.length = None, 0, 0
        self.linear = {}


@dataclass
class LinearState:
    """One request's linear-attention state in one layer: the conv's last ``taps - 1`` inputs
    ``[conv_dim, taps - 1]``, the delta rule's ``[v_heads, k_dim, v_dim]`` state at the last
    chunk boundary and the delta-rule inputs ``(q, k, v, g, beta)`` of the tokens since it
    (``kernels.linear_attention.continue_delta_rule``)."""

    conv: torch.Tensor
    boundary_state: torch.Tensor | None
    pending: tuple[torch.Tensor, ...]
