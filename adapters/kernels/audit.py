"""Evidence that the contract's kernels ran: per-op call counts, and a stock-op detector.

Off unless a run asks for it (``recording``). Off, ``registry.kernel`` hands out the backend
itself and a ``contract_op`` entry point costs one flag test: nothing is wrapped or allocated.
On, every call of a registry op (``registry.BACKENDS``) and of a ``contract_op`` entry point
adds one to its op's count: a Python integer add, no device synchronisation, so a CUDA decode
loop is never stalled by it (a CUDA graph replay would count nothing: it replays kernels, not
Python; nothing here captures graphs). A call made inside another contract op counts too (the
LM head's matmul inside ``lm_head_token_logprobs``).

``recording(strict=True)`` also pushes ``StockOpDetector``, a ``TorchFunctionMode``: it counts
every call of a stock op the contract replaces (``STOCK_OPS``: ``F.linear``, ``torch.matmul``,
SDPA, ``log_softmax``, ``rms_norm`` / ``layer_norm``, ...) made outside every contract op. The
contract kernels are made of torch ops themselves (``torch.bmm`` in the matmul reference), so a
depth counter, raised while any contract op runs, tells the detector where it is. A function
mode sees Python-level torch calls whatever the tensors' device (CPU and CUDA alike); the
backward of built-in ops runs in autograd's C++ engine and is not seen (a Python
``autograd.Function.backward`` would be: the gate records forward-only runs). Per process and
per thread of the forward: a run's ranks each record their own (``KernelCalls``; ``merge`` sums
them).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# contract op -> the stock torch functions it replaces on the scored path (public name, function)
_STOCK: dict[str, list[tuple[str, Callable]]] = {
    "invariant_matmul": [
        ("torch.nn.functional.linear", F.linear),
        ("torch.nn.functional.bilinear", F.bilinear),
        ("torch.matmul", torch.matmul),
        ("torch.Tensor.matmul", torch.Tensor.matmul),
        ("torch.Tensor.__matmul__", torch.Tensor.__matmul__),
        ("torch.Tensor.__rmatmul__", torch.Tensor.__rmatmul__),
        ("torch.mm", torch.mm),
        ("torch.Tensor.mm", torch.Tensor.mm),
        ("torch.bmm", torch.bmm),
        ("torch.Tensor.bmm", torch.Tensor.bmm),
        ("torch.addmm", torch.addmm),
        ("torch.Tensor.addmm", torch.Tensor.addmm),
        ("torch.baddbmm", torch.baddbmm),
        ("torch.Tensor.baddbmm", torch.Tensor.baddbmm),
        ("torch.mv", torch.mv),
        ("torch.Tensor.mv", torch.Tensor.mv),
        ("torch.einsum", torch.einsum),
        ("torch.tensordot", torch.tensordot),
    ],
    "chunked_attention": [
        ("torch.nn.functional.scaled_dot_product_attention", F.scaled_dot_product_attention),
        ("torch.nn.functional.multi_head_attention_forward", F.multi_head_attention_forward),
    ],
    "token_logprobs": [
        ("torch.log_softmax", torch.log_softmax),
        ("torch.Tensor.log_softmax", torch.Tensor.log_softmax),
        ("torch.nn.functional.log_softmax", F.log_softmax),
        ("torch.special.log_softmax", torch.special.log_softmax),
        ("torch.nn.functional.cross_entropy", F.cross_entropy),
    ],
    "rms_norm": [
        ("torch.nn.functional.rms_norm", F.rms_norm),
        ("torch.rms_norm", torch.rms_norm),
        ("torch.nn.functional.layer_norm", F.layer_norm),
        ("torch.layer_norm", torch.layer_norm),
        ("torch.nn.functional.group_norm", F.group_norm),
    ],
}
STOCK_OPS: dict[Callable, tuple[str, str]] = {
    fn: (op, name) for op, entries in _STOCK.items() for name, fn in entries
}
"""Each stock function the detector flags -> (the contract op that replaces it, its name)."""


@dataclass
class KernelCalls:
    """What one recorded run saw: contract-op calls, and (strict) stock-op calls outside them."""

    calls: dict[str, int] = field(default_factory=dict)
    """Contract op -> calls of its entry point (every rank of the run summed)."""
    stock: list[dict] | None = None
    """Strict only: one entry per (rank, contract op, stock function) seen outside every
    contract op: ``{"rank", "op", "stock", "calls"}``; None when the detector was off."""
    ranks: int = 1


class _State:
    """The process's recording state (one forward at a time per process)."""

    def __init__(self) -> None:
        self.on = False
        self.depth = 0  # contract ops running now (nested calls count once each)
        self.calls: Counter[str] = Counter()
        self.stock: Counter[tuple[str, str]] | None = None  # None: not detecting
        self.detector = False  # a StockOpDetector is on the mode stack (one is enough)


_STATE = _State()


def recording_on() -> bool:
    """Whether this process is recording (``registry.kernel``'s fast-path test)."""
    return _STATE.on


def counted(op: str, fn: Callable) -> Callable:
    """``fn`` counting its calls as ``op`` and marking the detector's "inside a contract op"."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        state = _STATE
        state.calls[op] += 1
        state.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            state.depth -= 1

    return run


def contract_op(op: str) -> Callable[[Callable], Callable]:
    """Decorator for a contract op outside the registry (device-generic: the log-softmax entry
    points): counted as ``op`` while recording, one flag test otherwise."""

    def wrap(fn: Callable) -> Callable:
        counting = counted(op, fn)

        @functools.wraps(fn)
        def entry(*args, **kwargs):
            if _STATE.on:
                return counting(*args, **kwargs)
            return fn(*args, **kwargs)

        return entry

    return wrap


def _floating(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_floating_point()
    if isinstance(value, list | tuple):
        return any(_floating(v) for v in value)
    return False


class StockOpDetector(TorchFunctionMode):
    """Counts calls of ``STOCK_OPS`` on floating-point tensors made outside every contract op."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        state = _STATE
        if state.depth == 0 and state.stock is not None:
            hit = STOCK_OPS.get(func)
            if hit is not None and (_floating(args) or _floating(tuple(kwargs.values()))):
                state.stock[hit] += 1
        return func(*args, **kwargs)


@contextmanager
def recording(strict: bool = False) -> Iterator[KernelCalls]:
    """Count contract-op calls (and, ``strict``, stock-op calls outside them) for the body; the
    yielded ``KernelCalls`` is filled in when the body ends (the previous state restored)."""
    saved = (_STATE.on, _STATE.depth, _STATE.calls, _STATE.stock, _STATE.detector)
    out = KernelCalls()
    _STATE.on, _STATE.depth, _STATE.calls = True, 0, Counter()
    _STATE.stock = Counter() if strict else None
    try:
        if strict and not _STATE.detector:  # a second mode would count every call twice
            _STATE.detector = True
            with StockOpDetector():
                yield out
        else:
            yield out
    finally:
        out.calls = dict(sorted(_STATE.calls.items()))
        if _STATE.stock is not None:
            out.stock = [
                {"rank": 0, "op": op, "stock": name, "calls": n}
                for (op, name), n in sorted(_STATE.stock.items())
            ]
        _STATE.on, _STATE.depth, _STATE.calls, _STATE.stock, _STATE.detector = saved


MODES = frozenset({"count", "strict"})
"""What a run may ask of ``maybe_recording``: counts only, or counts and the stock-op detector."""


@contextmanager
def maybe_recording(mode: str | None) -> Iterator[KernelCalls | None]:
    """``recording`` for ``mode`` ``"count"`` or ``"strict"``; nothing (yields None) for None."""
    if mode is None:
        yield None
        return
    if mode not in MODES:
        raise ValueError(f"kernel audit mode {mode!r}: expected one of {sorted(MODES)} or None")
    with recording(strict=mode == "strict") as calls:
        yield calls


def merge(per_rank: Mapping[int, KernelCalls | None]) -> KernelCalls | None:
    """One run's ``KernelCalls`` from its ranks': counts summed, stock entries tagged by rank
    (None when no rank recorded)."""
    parts = {r: c for r, c in sorted(per_rank.items()) if c is not None}
    if not parts:
        return None
    total: Counter[str] = Counter()
    stock: list[dict] | None = None
    for rank, part in parts.items():
        total.update(part.calls)
        if part.stock is not None:
            stock = (stock or []) + [{**e, "rank": rank} for e in part.stock]
    return KernelCalls(dict(sorted(total.items())), stock, ranks=len(parts))
