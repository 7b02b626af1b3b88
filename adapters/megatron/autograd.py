"""Forward bits from the SGLang kernel, gradients from megatron-core's own primitives.

``kernel_forward_megatron_backward(kernel_value, megatron_value)`` returns a tensor whose forward
value *is* ``kernel_value`` (bit for bit) and whose gradient is the gradient of ``megatron_value``:

    out = kernel_value.detach() + (megatron_value - megatron_value.detach())

``megatron_value - megatron_value.detach()`` is exactly +0 for every finite element, and
``k + 0 == k`` in IEEE arithmetic (``-0`` becomes ``+0``, which ``torch.equal`` treats as equal),
so forward bits are the kernel's; autograd sees only ``megatron_value`` and so runs its backward.
The differentiable computation runs only when a gradient can flow (grad mode on and some input
requires grad), so inference pays one forward; training pays two. ``straight_through`` is used
where the gradient comes from a whole differentiable computation (the MoE gating; attention has
its own autograd function, ``attention.KernelAttention``).

Linears do not compose at the value level: ``KernelValueLinear`` builds the context megatron's
linear forward builds and returns the kernel's value, so its backward is megatron-core's own
(``LinearWithGradAccumulationAndAsyncCommunication``: TP all-reduce of dgrad, wgrad
accumulation) and the training forward runs one GEMM per linear.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from megatron.core.tensor_parallel.layers import (
    LinearWithGradAccumulationAndAsyncCommunication as _MegatronLinear,
)
from megatron.core.tensor_parallel.layers import custom_fwd as _megatron_custom_fwd
from megatron.core.utils import get_tensor_model_parallel_group_if_none


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


# ---------------------------------------------------------------------------------------------
# Linears: the kernel's value, megatron-core's backward, one GEMM in forward.
# ---------------------------------------------------------------------------------------------

# What megatron-core's linear forward leaves on ``ctx`` for its backward (0.16.1); a test runs
# megatron's own forward and checks it sets nothing else, so a version that reads more fails there.
LINEAR_CTX_FIELDS = (
    "main_grad",
    "use_bias",
    "gradient_accumulation_fusion",
    "allreduce_dgrad",
    "sequence_parallel",
    "wgrad_deferral_limit",
    "grad_output_buffer",
    "tp_group",
)


class KernelValueLinear(torch.autograd.Function):
    """``y = x Wᵀ (+ b)`` with the value of ``kernel_fn()`` and megatron-core's backward.

    Takes the arguments of megatron's ``linear_with_grad_accumulation_and_async_allreduce`` (its
    modules call ``_forward_impl`` with them) plus the kernel. Forward builds the context
    megatron's ``LinearWithGradAccumulationAndAsyncCommunication.forward`` builds (saved input and
    weight, its flags) but computes no GEMM of its own: the value is the kernel's. Backward is
    megatron's, unchanged: ``dX = dY·W`` (all-reduced over TP when ``allreduce_dgrad``) and
    ``dW = dYᵀ·X`` (into ``main_grad`` with gradient-accumulation fusion). Unlike
    ``straight_through``, the layer's forward runs one GEMM, the kernel's."""

    @staticmethod
    @_megatron_custom_fwd
    def forward(
        ctx,
        kernel_fn,
        input,
        weight,
        bias,
        gradient_accumulation_fusion,
        allreduce_dgrad,
        sequence_parallel,
        grad_output_buffer,
        wgrad_deferral_limit,
        tp_group,
    ):
        if sequence_parallel:
            raise ValueError(
                "true-on-policy contracts disable sequence parallel (schema: "
                "disable_megatron_sequence_parallel); the kernel linear got sequence_parallel=True"
            )
        ctx.save_for_backward(input, weight)
        fused = gradient_accumulation_fusion and hasattr(weight, "main_grad")
        ctx.main_grad = weight.main_grad if fused else None
        ctx.use_bias = bias is not None
        ctx.gradient_accumulation_fusion = gradient_accumulation_fusion
        ctx.allreduce_dgrad = allreduce_dgrad
        ctx.sequence_parallel = sequence_parallel
        ctx.wgrad_deferral_limit = wgrad_deferral_limit
        ctx.grad_output_buffer = grad_output_buffer
        ctx.tp_group = tp_group
        # megatron's output dtype (its backward multiplies the gradient with the weight)
        ctx.megatron_dtype = torch.promote_types(input.dtype, weight.dtype)
        value = kernel_fn()
        return value if bias is None else value + bias

    @staticmethod
    def backward(ctx, grad_output):
        grads = _MegatronLinear.backward(ctx, grad_output.to(ctx.megatron_dtype))
        return (None, *grads)


def kernel_value_linear(
    kernel_fn: Callable[[], torch.Tensor],
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    gradient_accumulation_fusion: bool = False,
    allreduce_dgrad: bool = False,
    sequence_parallel: bool = False,
    grad_output_buffer: list | None = None,
    wgrad_deferral_limit: int | None = None,
    tp_group=None,
) -> torch.Tensor:
    """``KernelValueLinear`` with megatron's argument names (a module's ``_forward_impl``)."""
    if not needs_grad(input, weight):  # inference: nothing to save, nothing else to run
        with torch.no_grad():
            value = kernel_fn()
        return value if bias is None else value + bias
    tp_group = get_tensor_model_parallel_group_if_none(tp_group)
    return KernelValueLinear.apply(
        kernel_fn,
        input,
        weight,
        bias,
        gradient_accumulation_fusion,
        allreduce_dgrad,
        sequence_parallel,
        grad_output_buffer,
        wgrad_deferral_limit,
        tp_group,
    )
