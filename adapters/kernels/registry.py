"""One registry: which backend implements each device-specific contract op on a device.

Two backends share every op's semantics (the contract's K block, per-tile rounding to the
accumulation dtype, its tile order, fixed KV chunks at absolute positions, fixed vocab blocks):
``torch``, the PyTorch reference (CPU, CI, and any device), and ``triton`` (CUDA: tensor-core
tile dots). The rollout and the trainer look ops up here by the tensor's device, so on one device
they always run the same backend; parity is per device. The small ops (``rms_norm``,
``apply_rope``, ``silu_glu``, the log-softmax's ``logsoftmax_chunk_sums`` and its gradient
``logprob_backward``) are one Triton kernel each on CUDA, with the reference's operations and
roundings (a decode step's reference was thousands of tiny launches: ``fixed_sum`` alone is one per
tree level); the ``triton`` backend runs them under autograd too, so the trainer's training
forward has the rollout's bits. Ops not listed (residual, the chunks' own tree, all-reduce) are
device-generic PyTorch, shared by both backends.

While a run records (``audit.recording``: the parity gate's ``kernel_calls`` and ``--strict``),
``kernel`` hands out the backend wrapped to count its calls as the op; otherwise the backend
itself.

``CONTRACTGEN_KERNEL_BACKEND=torch|triton`` overrides the device default (benchmarks; the Triton
interpreter on CPU with ``TRITON_INTERPRET=1``). A process must not change it between the rollout
and the trainer.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from functools import cache

import torch

from . import audit

ENV = "CONTRACTGEN_KERNEL_BACKEND"

# backend -> op -> "module:function" (lazy: importing the torch backend never imports triton)
BACKENDS: dict[str, dict[str, str]] = {
    "torch": {
        "invariant_matmul": "contractgen.adapters.kernels.matmul:reference_matmul",
        "chunked_attention": "contractgen.adapters.kernels.attention:reference_attention",
        "chunked_attention_lse": "contractgen.adapters.kernels.attention:reference_attention_lse",
        "attention_backward": "contractgen.adapters.kernels.attention:reference_attention_backward",
        "rms_norm": "contractgen.adapters.kernels.norm:reference_rms_norm",
        "apply_rope": "contractgen.adapters.kernels.rope:reference_apply_rope",
        "silu_glu": "contractgen.adapters.kernels.mlp:reference_silu_glu",
        "logsoftmax_chunk_sums": "contractgen.adapters.kernels.logsoftmax:reference_chunk_sums",
        "logprob_backward": "contractgen.adapters.kernels.logsoftmax:reference_logprob_backward",
    },
    "triton": {
        "invariant_matmul": "contractgen.adapters.kernels.triton.matmul:triton_matmul",
        "chunked_attention": "contractgen.adapters.kernels.triton.attention:triton_attention",
        "chunked_attention_lse": "contractgen.adapters.kernels.triton.attention:triton_attention_lse",
        "attention_backward": "contractgen.adapters.kernels.triton.attention_bwd:triton_attention_backward",
        "rms_norm": "contractgen.adapters.kernels.triton.norm:triton_rms_norm",
        "apply_rope": "contractgen.adapters.kernels.triton.rope:triton_apply_rope",
        "silu_glu": "contractgen.adapters.kernels.triton.mlp:triton_silu_glu",
        "logsoftmax_chunk_sums": (
            "contractgen.adapters.kernels.triton.logsoftmax:triton_chunk_sums"
        ),
        "logprob_backward": "contractgen.adapters.kernels.triton.logsoftmax:triton_logprob_backward",
    },
}

# device type -> default backend; a device type not listed runs the reference
DEVICE_BACKENDS: dict[str, str] = {"cpu": "torch", "cuda": "triton"}


@cache
def _triton_usable() -> bool:
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def backend_for(device: torch.device | str) -> str:
    """The backend name for ``device``: the override, else the device default; ``triton`` falls
    back to ``torch`` (same semantics, other tile-dot bits) only where triton is not installed."""
    name = os.environ.get(ENV) or DEVICE_BACKENDS.get(torch.device(device).type, "torch")
    if name not in BACKENDS:
        raise ValueError(f"{ENV}={name!r} is not a kernel backend; known: {sorted(BACKENDS)}")
    if name == "triton" and not _triton_usable():
        return "torch"
    return name


@cache
def _resolve(backend: str, op: str) -> Callable:
    try:
        target = BACKENDS[backend][op]
    except KeyError:
        known = sorted(BACKENDS.get(backend, {}))
        raise ValueError(f"kernel op {op!r} has no {backend!r} backend; known: {known}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


@cache
def _counted(backend: str, op: str) -> Callable:
    return audit.counted(op, _resolve(backend, op))


def kernel(op: str, device: torch.device | str) -> Callable:
    """The implementation of ``op`` for tensors on ``device`` (counting its calls while the
    process records: ``audit.recording``)."""
    if audit.recording_on():
        return _counted(backend_for(device), op)
    return _resolve(backend_for(device), op)
