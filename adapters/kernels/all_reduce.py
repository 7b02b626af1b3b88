"""Fixed-order tree all-reduce: gather every rank's partial, sum adjacent pairs level by level.

Every rank computes the same sums in the same order, so every rank gets identical bits, whatever
NCCL (ring/tree, channel count) or gloo would have chosen. The order for ranks 0..3 is
``((r0 + r1) + (r2 + r3))``. Sizes other than powers of two are refused (the contract validation
only admits power-of-two TP; only then is each rank's K range a whole subtree of the TP=1 tree).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from . import planted
from ._dtypes import bits_view, from_bits
from ._streams import stream_key
from .policy import KernelPolicy
from .reduce import pairwise_sum


def tree_sum(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tree all-reduce's order applied locally (rank order = list order)."""
    return pairwise_sum(tensors)


def world_size(group=None) -> int:
    """Ranks in ``group``; 1 when torch.distributed is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def all_gather_exact(t: torch.Tensor, group=None) -> list[torch.Tensor]:
    """All ranks' tensors (same shape/dtype everywhere), moved as raw bits, in rank order."""
    bits = bits_view(t)
    out = [torch.empty_like(bits) for _ in range(world_size(group))]
    dist.all_gather(out, bits, group=group)
    return [from_bits(o, t) for o in out]


_GATHER_BUFFERS: dict[tuple, torch.Tensor] = {}


def _gather_buffer(device: torch.device, group, nbytes: int) -> torch.Tensor:
    """A uint8 buffer of at least ``nbytes`` kept per (device, stream, group) and reused by every
    call there: the gather's destination without an allocation per call. The collective waits for
    the calling stream, on which the previous call's sum (the last reader) was queued."""
    key = (*stream_key(device), id(group))
    buf = _GATHER_BUFFERS.get(key)
    if buf is None or buf.numel() < nbytes:
        buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
        _GATHER_BUFFERS[key] = buf
    return buf[:nbytes]


def _fused_sum(parts: torch.Tensor) -> torch.Tensor | None:
    """The Triton one-launch tree sum (CUDA, 4 or 8 ranks), or None where it does not apply."""
    if parts.device.type != "cuda" or parts.shape[0] not in (4, 8):
        return None
    try:
        from .triton.tree_sum import fused_tree_sum, supports
    except ImportError:  # no triton: the stacked adds below
        return None
    return fused_tree_sum(parts) if supports(parts) else None


def _gathered_tree_sum(t: torch.Tensor, group) -> torch.Tensor:
    """NCCL: one gather of every rank's bits into one preallocated ``[ranks, ...]`` buffer, then
    the same adjacent-pair tree as ``tree_sum``: at TP=2 a single add; at 4 and 8 one fused Triton
    kernel (``triton/tree_sum.py``), else one stacked add per level."""
    n = world_size(group)
    bits = bits_view(t)
    flat = _gather_buffer(t.device, group, n * bits.numel())
    dist.all_gather_into_tensor(flat, bits, group=group)
    parts = flat.view(t.dtype).view(n, *t.shape)
    fused = _fused_sum(parts.view(n, -1))
    if fused is not None:
        return fused.view(t.shape)
    while parts.shape[0] > 1:
        parts = parts[0::2] + parts[1::2]
    return parts[0]


class _TreeAllReduce(torch.autograd.Function):
    """Forward: fixed-tree sum over ranks. Backward: identity (Megatron's reduce-from-TP region)."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, group) -> torch.Tensor:
        if dist.get_backend(group) == "nccl":
            return _gathered_tree_sum(t, group)
        return tree_sum(all_gather_exact(t, group))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def tree_all_reduce(t: torch.Tensor, group=None) -> torch.Tensor:
    """Sum of ``t`` over the ranks of ``group`` in the fixed pairwise order, same bits everywhere."""
    n = world_size(group)
    if n == 1 or planted.active("tp_reduce_skipped"):  # the latter: the gate's self-test only
        return t
    if n & (n - 1):
        raise ValueError(
            f"tree_all_reduce: group size {n} is not a power of two; the fixed-tree order is only "
            "defined (and TP-invariant) for TP sizes 1, 2, 4, 8, ... — pick a power-of-two TP"
        )
    return _TreeAllReduce.apply(t, group)


def nccl_all_reduce(t: torch.Tensor, group=None) -> torch.Tensor:
    """Stock ``torch.distributed.all_reduce`` (backend-chosen order). Never under a contract.

    gloo cannot reduce 16-bit floats: there the sum runs in float32 and is rounded once."""
    if world_size(group) == 1:
        return t
    low = t.dtype in (torch.bfloat16, torch.float16) and dist.get_backend(group) == "gloo"
    out = t.detach().to(torch.float32) if low else t.detach().clone()
    dist.all_reduce(out, group=group)
    return out.to(t.dtype)


ALL_REDUCES: dict[str, Callable[..., torch.Tensor]] = {
    "fixed_tree": tree_all_reduce,
    "nccl": nccl_all_reduce,
}


def all_reduce_for(kp: KernelPolicy) -> Callable[..., torch.Tensor]:
    """The all-reduce ``kp.all_reduce`` names."""
    try:
        return ALL_REDUCES[kp.all_reduce]
    except KeyError:
        raise ValueError(
            f"unknown all_reduce {kp.all_reduce!r}; known: {sorted(ALL_REDUCES)}"
        ) from None
