"""The contract kernels, one library for the rollout and the trainer.

One small module per op, casts explicit; each module holds the PyTorch reference (CPU, CI, the
readable spec). Ops whose fast form differs by device (the invariant matmul, attention) dispatch
through ``registry.kernel(op, device)`` to the reference or to the Triton backend (``triton/``,
CUDA), so both sides of a parity run call the same backend on a device."""

from . import (
    attention_meta,  # noqa: F401  (the trainer's attention backward: kernels.attention_meta)
)
from .all_reduce import all_reduce_for, pairwise_sum, tree_all_reduce, tree_sum
from .attention import attention_backward, chunked_attention, chunked_attention_lse
from .linear import column_parallel_linear, row_parallel_linear
from .logsoftmax import (
    full_logprobs,
    lm_head_token_logprobs,
    token_logprobs,
    vocab_parallel_token_logprobs,
)
from .matmul import binary_matmul, combine_tiles, invariant_matmul, tile_partials
from .mlp import silu_glu
from .moe import moe_block, route
from .norm import rms_norm
from .policy import KernelPolicy, kernel_policy
from .registry import backend_for, kernel
from .residual import residual_add
from .rope import apply_rope, rope_cos_sin

__all__ = [
    "KernelPolicy",
    "all_reduce_for",
    "apply_rope",
    "attention_backward",
    "backend_for",
    "binary_matmul",
    "chunked_attention",
    "chunked_attention_lse",
    "column_parallel_linear",
    "combine_tiles",
    "full_logprobs",
    "invariant_matmul",
    "kernel",
    "kernel_policy",
    "lm_head_token_logprobs",
    "moe_block",
    "pairwise_sum",
    "residual_add",
    "rms_norm",
    "rope_cos_sin",
    "route",
    "row_parallel_linear",
    "silu_glu",
    "tile_partials",
    "token_logprobs",
    "tree_all_reduce",
    "tree_sum",
    "vocab_parallel_token_logprobs",
]
