"""Attention backward with what the caller already knows about its pack.

``attention.attention_backward`` takes offsets and positions only, so the Triton backend checks on
the device that each sequence's query positions run ``p0, p0 + 1, ...`` (what its kernels
assume) and reads the verdict on the host: one sync per call, one per layer in training. A trainer
builds its pack on the host and knows the answer there (``packing.SGLangPackedSeqParams
.positions_contiguous``); ``attention_backward_known`` passes it down to the backends that use it.
Same results, bit for bit, as ``attention_backward`` (the flag only skips the check).

``attention.attention_backward`` stays the entry point the trainer's backward goes through: the
parity gate's planted backward bug (``planted.BACKWARD_BUGS``) replaces it on the module for a
run, and where it is replaced the call goes to the replacement, without the promise (the
backend then checks on the device, as before).
"""

from __future__ import annotations

from collections.abc import Callable

from . import attention
from .policy import KernelPolicy
from .registry import backend_for, kernel


def _no_extra(positions_contiguous: bool | None) -> dict:
    return {}


def _triton_extra(positions_contiguous: bool | None) -> dict:
    return {"positions_contiguous": positions_contiguous}


# backend -> the keyword arguments its ``attention_backward`` takes for what the caller knows
KNOWN_BY_BACKEND: dict[str, Callable[[bool | None], dict]] = {
    "torch": _no_extra,  # the reference needs no such promise
    "triton": _triton_extra,
}


def attention_backward_known(
    q_LHD, k_SKD, v_SKD, o_LHD, lse_LH, do_LHD, q_positions, kp: KernelPolicy, *, cu_seqlens_q=None,
    cu_seqlens_k=None, scale=None, positions_contiguous: bool | None = None,
):  # fmt: skip
    """``attention.attention_backward`` (the registry's backend, counted as that op while a run
    records) told whether every sequence's query positions are contiguous; ``None``: unknown,
    the backend checks as it would."""
    kw = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, scale=scale)
    entry = attention.attention_backward
    if getattr(entry, "__module__", None) != attention.__name__:  # replaced (a planted bug)
        return entry(q_LHD, k_SKD, v_SKD, o_LHD, lse_LH, do_LHD, q_positions, kp, **kw)
    backend = backend_for(q_LHD.device)
    impl = kernel("attention_backward", q_LHD.device)
    kw.update(KNOWN_BY_BACKEND[backend](positions_contiguous))
    return impl(q_LHD, k_SKD, v_SKD, o_LHD, lse_LH, do_LHD, q_positions, kp, **kw)
