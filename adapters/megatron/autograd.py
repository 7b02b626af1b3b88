"""Forward bits from the SGLang kernel, gradients from megatron-core's own primitives.

``kernel_forward_megatron_backward(kernel_value, megatron_value)`` returns a tensor whose forward
value *is* ``kernel_value`` (bit for bit) and whose gradient is the gradient of ``megatron_value``:

    out = kernel_value.detach() + (megatron_value - megatron_value.detach())

``megatron_value - megatron_value.detach()`` is exactly +0 for every finite element, and
``k + 0 == k`` in IEEE arithmetic (``-0`` becomes ``+0``, which ``torch.equal`` treats as equal),
so forward bits are the kernel's; autograd sees only ``megatron_value`` and so runs megatron-core's
backward (``LinearWithGradAccumulationAndAsyncCommunication``: TP all-reduce of dgrad, wgrad
accumulation). We chose this over a custom ``autograd.Function`` because megatron's backward is
itself an ``autograd.Function`` whose ``ctx`` cannot be driven from outside; composing at the
value level keeps its backward untouched. The megatron primitive runs only when a gradient can
flow (grad mode on and some input requires grad), so inference pays one forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


def needs_grad(*tensors: torch.Tensor | None) -> bool:
    """True when autograd would record an op on any of ``tensors``."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def kernel_forward_megatron_backward(
    kernel_value: torch.Tensor, megatron_value: torch.Tensor
) -> torch.Tensor:
    """Value of ``kernel_value``, gradient of ``megatron_value`` (see module docstring)."""
    if kernel_value.shape != megatron_value.shape:
        raise ValueError(
            f"kernel value shape {tuple(kernel_value.shape)} != megatron value shape "
            f"{tuple(megatron_value.shape)}"
        )
    grad_path = megatron_value - megatron_value.detach()
    return kernel_value.detach() + grad_path.to(kernel_value.dtype)


def straight_through(
    kernel_fn: Callable[[], torch.Tensor],
    megatron_fn: Callable[[], torch.Tensor],
    inputs: Iterable[torch.Tensor | None],
) -> torch.Tensor:
    """Run ``kernel_fn`` without autograd; add ``megatron_fn``'s gradient path when one is needed."""
    with torch.no_grad():
        value = kernel_fn()
    if not needs_grad(*inputs):
        return value
    return kernel_forward_megatron_backward(value, megatron_fn())
