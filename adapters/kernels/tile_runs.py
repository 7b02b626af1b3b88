"""The K-tile orders of the invariant matmul, in one place: how tile partials are combined
(``TILE_ORDERS``, ``combine_tiles``), how many tiles a first-level run holds (``_run_length``) and,
under ``fixed_runs``, how wide a run is (``k_runs``, ``fixed_run_width``) and what a row-parallel
rank runs (``shard_policy``). The torch and Triton backends both read these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from types import SimpleNamespace

import torch

from ..tile_order import first_level_block
from .policy import KernelPolicy
from .reduce import pairwise_sum, sequential_sum


def _sglang_first_level(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    block = first_level_block(len(parts))
    runs = [sequential_sum(parts[i : i + block]) for i in range(0, len(parts), block)]
    return pairwise_sum(runs)


def _binary(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    return pairwise_sum(list(parts))


TILE_ORDERS: dict[str, Callable[[Sequence[torch.Tensor]], torch.Tensor]] = {
    "sglang_first_level": _sglang_first_level,
    "binary": _binary,
    # the parts are the runs (each one float32 dot over its K range): a binary tree over them
    "fixed_runs": _binary,
}


def combine_tiles(parts: Sequence[torch.Tensor], order: str) -> torch.Tensor:
    """Sum tile partials (each ``[M, N]`` in the accumulation dtype) in the named order."""
    try:
        combine = TILE_ORDERS[order]
    except KeyError:
        raise ValueError(
            f"unknown matmul_tile_order {order!r}; known: {sorted(TILE_ORDERS)}"
        ) from None
    return combine(parts)


def _run_length(order: str, num_tiles: int) -> int:
    """Tiles per sequential first-level run in the named order (then runs are pairwise summed).
    ``fixed_runs`` takes its run length from the policy: ``fixed_run_width``."""
    if order not in TILE_ORDERS:
        raise ValueError(f"unknown matmul_tile_order {order!r}; known: {sorted(TILE_ORDERS)}")
    if order == "fixed_runs":
        raise ValueError("'fixed_runs' runs are matmul_k_runs equal runs: use fixed_run_width")
    return first_level_block(num_tiles) if order == "sglang_first_level" else 1


def k_runs(kp: KernelPolicy) -> int | None:
    """The ``fixed_runs`` run count of a call made with ``kp``: ``matmul_column_k_runs`` where the
    contract sets it (a call with the contract's own policy is a matmul whose K no layout
    splits), else ``matmul_k_runs``. ``shard_policy`` gives a row-parallel call a policy without
    the column count."""
    return getattr(kp, "matmul_column_k_runs", None) or getattr(kp, "matmul_k_runs", None)


def fixed_run_width(k: int, kp: KernelPolicy) -> int:
    """K per run under ``fixed_runs``: ``k / k_runs(kp)``, whole ``matmul_k_block`` tiles.
    ``k`` is the K this call sees: a row-parallel rank passes ``shard_policy(kp, tp)``."""
    runs, block = k_runs(kp), kp.matmul_k_block
    if not runs:
        raise ValueError("matmul_tile_order 'fixed_runs' needs kernel_policy.matmul_k_runs")
    if k % (runs * block):
        raise ValueError(
            f"K={k} is not {runs} runs of whole {block}-wide tiles (kernel_policy "
            "matmul_k_runs, matmul_column_k_runs, matmul_k_block): the contract's layout rules "
            "admit no such shape"
        )
    return k // runs


_SHARD_POLICIES: dict[tuple[int, int], tuple[object, object]] = {}


def shard_policy(kp: KernelPolicy, tp: int):
    """The policy a row-parallel rank of ``tp`` runs on its K shard. Under ``fixed_runs`` the
    full K's ``matmul_k_runs`` runs are split over the ranks, so a rank's K holds
    ``matmul_k_runs / tp`` of them (a whole subtree; the tree all-reduce adds the top). The other
    orders derive their runs from the K they see, and are returned unchanged. The rank's policy
    has no ``matmul_column_k_runs`` (that count is for the matmuls no layout splits), so at TP=1
    too a contract that sets it gets a policy of its own here. Cached per policy object (the
    decode loop calls this per layer)."""
    if getattr(kp, "matmul_tile_order", None) != "fixed_runs":
        return kp
    if tp == 1 and getattr(kp, "matmul_column_k_runs", None) is None:
        return kp
    key = (id(kp), tp)
    hit = _SHARD_POLICIES.get(key)
    if hit is not None and hit[0] is kp:
        return hit[1]
    runs = kp.matmul_k_runs
    if runs % tp:
        raise ValueError(
            f"TP={tp} does not divide kernel_policy.matmul_k_runs={runs}: each rank needs whole runs"
        )
    change = {"matmul_k_runs": runs // tp}
    if hasattr(kp, "matmul_column_k_runs"):
        change["matmul_column_k_runs"] = None
    local = (
        dataclasses.replace(kp, **change)
        if dataclasses.is_dataclass(kp)
        else SimpleNamespace(**{**vars(kp), **change})
    )
    _SHARD_POLICIES[key] = (kp, local)
    return local
